-- IF NOT EXISTS: objects created before this migration already hold these tables (they were
-- created by hand-written DDL); this first migration adopts them as they are.
CREATE TABLE IF NOT EXISTS `allocations` (
	`tenant_id` text NOT NULL,
	`generation` integer NOT NULL,
	`size` integer NOT NULL,
	`phase` text NOT NULL,
	`idle_since` integer,
	`leases` integer DEFAULT 0 NOT NULL,
	`pinned` integer DEFAULT 0 NOT NULL,
	`migrating` integer DEFAULT 0 NOT NULL,
	`updated_at` integer NOT NULL,
	PRIMARY KEY(`tenant_id`, `generation`)
);
--> statement-breakpoint
CREATE TABLE IF NOT EXISTS `counters` (
	`name` text PRIMARY KEY NOT NULL,
	`value` integer NOT NULL
);