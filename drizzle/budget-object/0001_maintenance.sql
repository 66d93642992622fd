CREATE TABLE `maintenance` (
	`id` text PRIMARY KEY NOT NULL,
	`purpose` text NOT NULL,
	`tenant_id` text,
	`acquired_at` integer NOT NULL,
	`expires_at` integer NOT NULL
);
