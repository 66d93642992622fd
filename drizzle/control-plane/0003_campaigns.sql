CREATE TABLE "app_schema_versions_seen" (
	"version" integer NOT NULL,
	"minute" timestamp with time zone NOT NULL,
	CONSTRAINT "app_schema_versions_seen_version_minute_pk" PRIMARY KEY("version","minute")
);
--> statement-breakpoint
CREATE TABLE "campaign_tenants" (
	"campaign_id" text NOT NULL,
	"tenant_id" text NOT NULL,
	"host" text NOT NULL,
	"cohort" text NOT NULL,
	"position" integer NOT NULL,
	"state" text NOT NULL,
	"from_version" integer NOT NULL,
	"to_version" integer,
	"attempts" integer DEFAULT 0 NOT NULL,
	"claim_token" text,
	"claimed_at" timestamp with time zone,
	"retry_at" timestamp with time zone,
	"started_at" timestamp with time zone,
	"finished_at" timestamp with time zone,
	"failure_summary" text,
	"skip_reason" text,
	CONSTRAINT "campaign_tenants_campaign_id_tenant_id_pk" PRIMARY KEY("campaign_id","tenant_id")
);
--> statement-breakpoint
CREATE TABLE "campaigns" (
	"id" text PRIMARY KEY NOT NULL,
	"seq" bigint GENERATED ALWAYS AS IDENTITY (sequence name "campaigns_seq_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"state" text NOT NULL,
	"paused_from" text,
	"to_version" integer NOT NULL,
	"concurrency" integer NOT NULL,
	"continue_on_failure" boolean NOT NULL,
	"force" boolean NOT NULL,
	"drain_timeout_ms" integer NOT NULL,
	"stability_window_ms" integer NOT NULL,
	"canary_percent" double precision,
	"listed" boolean DEFAULT false NOT NULL,
	"contract_steps" integer[] DEFAULT '{}'::integer[] NOT NULL,
	"blocked_reason" text,
	"reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone,
	"finished_at" timestamp with time zone,
	CONSTRAINT "campaigns_seq_unique" UNIQUE("seq")
);
--> statement-breakpoint
ALTER TABLE "campaign_tenants" ADD CONSTRAINT "campaign_tenants_campaign_id_campaigns_id_fk" FOREIGN KEY ("campaign_id") REFERENCES "public"."campaigns"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "campaign_tenants_position" ON "campaign_tenants" USING btree ("campaign_id","position");--> statement-breakpoint
CREATE INDEX "campaign_tenants_progress" ON "campaign_tenants" USING btree ("campaign_id","cohort","state","position");--> statement-breakpoint
CREATE INDEX "campaigns_active" ON "campaigns" USING btree ("seq") WHERE "campaigns"."state" IN ('pending', 'canary', 'rollout');