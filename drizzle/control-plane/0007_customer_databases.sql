CREATE TABLE "adopted_databases" (
	"tenant_id" text PRIMARY KEY NOT NULL,
	"tunnel" text NOT NULL,
	"hostname" text NOT NULL,
	"port" integer NOT NULL,
	"credential_policy" text NOT NULL,
	"report" jsonb NOT NULL,
	"attached_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "campaigns" ADD COLUMN "adopted_policy" text DEFAULT 'skip' NOT NULL;--> statement-breakpoint
ALTER TABLE "campaigns" ADD COLUMN "adopted_skipped" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "tenant_erasures" ADD COLUMN "detached" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "adopted_databases" ADD CONSTRAINT "adopted_databases_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;