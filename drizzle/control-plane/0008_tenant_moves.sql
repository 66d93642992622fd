CREATE TABLE "tenant_moves" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "tenant_moves_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"tenant_id" text NOT NULL,
	"from_region" text NOT NULL,
	"to_region" text NOT NULL,
	"state" text NOT NULL,
	"stage" text NOT NULL,
	"tenant_status" text NOT NULL,
	"host" text NOT NULL,
	"fenced_generation" integer DEFAULT 0 NOT NULL,
	"actor" text NOT NULL,
	"counts" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"next_attempt_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"moved_at" timestamp with time zone
);
--> statement-breakpoint
CREATE UNIQUE INDEX "tenant_moves_running" ON "tenant_moves" USING btree ("tenant_id") WHERE "tenant_moves"."state" = 'moving';--> statement-breakpoint
CREATE INDEX "tenant_moves_tenant" ON "tenant_moves" USING btree ("tenant_id","id");--> statement-breakpoint
CREATE INDEX "tenant_moves_due" ON "tenant_moves" USING btree ("next_attempt_at") WHERE "tenant_moves"."state" = 'moving';