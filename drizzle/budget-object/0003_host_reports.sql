CREATE TABLE `host_reports` (
	`host` text PRIMARY KEY NOT NULL,
	`report` text NOT NULL,
	`probed_at` integer NOT NULL
);
