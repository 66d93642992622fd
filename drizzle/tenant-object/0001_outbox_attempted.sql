ALTER TABLE `outbox` ADD `attempted` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `usage_outbox` ADD `attempted` integer DEFAULT 0 NOT NULL;