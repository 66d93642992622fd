-- IF NOT EXISTS: objects created before this migration already hold these tables (they were
-- created by hand-written DDL); this first migration adopts them as they are.
CREATE TABLE IF NOT EXISTS `kv` (
	`k` text PRIMARY KEY NOT NULL,
	`v` text NOT NULL
);
--> statement-breakpoint
CREATE TABLE IF NOT EXISTS `outbox` (
	`seq` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`generation` integer NOT NULL,
	`from_state` text NOT NULL,
	`to_state` text NOT NULL,
	`reason` text NOT NULL,
	`at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE IF NOT EXISTS `session_tokens` (
	`token_hash` text PRIMARY KEY NOT NULL,
	`generation` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`lost` integer DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE TABLE IF NOT EXISTS `usage_outbox` (
	`seq` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`queries` integer NOT NULL,
	`rows_returned` integer NOT NULL,
	`errors` integer NOT NULL,
	`lease_ms` integer NOT NULL,
	`pool_starts` integer NOT NULL,
	`at` integer NOT NULL
);