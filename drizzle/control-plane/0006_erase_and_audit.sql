CREATE TABLE "audit_log" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "audit_log_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"actor" text NOT NULL,
	"action" text NOT NULL,
	"tenant_id" text,
	"detail" jsonb DEFAULT '{}'::jsonb NOT NULL
);
--> statement-breakpoint
CREATE TABLE "tenant_erasures" (
	"ordinal" bigint PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"state" text NOT NULL,
	"stage" text NOT NULL,
	"host" text NOT NULL,
	"database_name" text,
	"role_name" text,
	"key_ids" text[] DEFAULT '{}'::text[] NOT NULL,
	"actor" text NOT NULL,
	"forced" boolean DEFAULT false NOT NULL,
	"counts" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"next_attempt_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"erased_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "campaigns" ADD COLUMN "erased_tenants" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX "audit_log_at" ON "audit_log" USING btree ("at");--> statement-breakpoint
CREATE INDEX "audit_log_tenant" ON "audit_log" USING btree ("tenant_id","id");--> statement-breakpoint
CREATE INDEX "audit_log_action" ON "audit_log" USING btree ("action","id");--> statement-breakpoint
CREATE UNIQUE INDEX "tenant_erasures_running" ON "tenant_erasures" USING btree ("tenant_id") WHERE "tenant_erasures"."state" = 'erasing';--> statement-breakpoint
CREATE INDEX "tenant_erasures_tenant" ON "tenant_erasures" USING btree ("tenant_id");--> statement-breakpoint
CREATE INDEX "tenant_erasures_due" ON "tenant_erasures" USING btree ("next_attempt_at") WHERE "tenant_erasures"."state" = 'erasing';