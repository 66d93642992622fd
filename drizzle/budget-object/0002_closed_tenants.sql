CREATE TABLE `closed_tenants` (
	`tenant_id` text PRIMARY KEY NOT NULL,
	`closed_at` integer NOT NULL
);
