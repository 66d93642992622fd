ALTER TABLE `allocations` ADD `floor` integer;--> statement-breakpoint
ALTER TABLE `allocations` ADD `start_size` integer;--> statement-breakpoint
ALTER TABLE `allocations` ADD `recent_peak` integer;