CREATE TABLE "fold_outcomes" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "fold_outcomes_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"scheduled_at" timestamp with time zone,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"duration_ms" integer NOT NULL,
	"outcome" text NOT NULL,
	"folded_rows" integer DEFAULT 0 NOT NULL,
	"replayed_rows" integer DEFAULT 0 NOT NULL,
	"backlog_remains" boolean DEFAULT false NOT NULL,
	"trimmed_generations" integer DEFAULT 0 NOT NULL,
	"trimmed_events" integer DEFAULT 0 NOT NULL,
	"trimmed_outcomes" integer DEFAULT 0 NOT NULL,
	"pin_kind" text,
	"pin_pid" integer,
	"pin_gid" text,
	"pin_slot" text,
	"pin_seconds" double precision,
	"message" text
);
--> statement-breakpoint
CREATE TABLE "usage_rollups" (
	"tenant_id" text PRIMARY KEY NOT NULL,
	"queries" bigint DEFAULT 0 NOT NULL,
	"rows_returned" bigint DEFAULT 0 NOT NULL,
	"errors" bigint DEFAULT 0 NOT NULL,
	"lease_ms" bigint DEFAULT 0 NOT NULL,
	"pool_starts" bigint DEFAULT 0 NOT NULL,
	"folded_seq" bigint DEFAULT 0 NOT NULL,
	"folded_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE INDEX "fold_outcomes_started_at" ON "fold_outcomes" USING btree ("started_at");--> statement-breakpoint
CREATE INDEX "generation_ledger_started_at" ON "generation_ledger" USING btree ("started_at");