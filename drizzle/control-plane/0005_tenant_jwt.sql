CREATE TABLE "tenant_jwt" (
	"tenant_id" text PRIMARY KEY NOT NULL,
	"issuer" text NOT NULL,
	"audiences" text[] NOT NULL,
	"jwks" jsonb,
	"jwks_url" text,
	"role" text NOT NULL,
	"algorithms" text[] NOT NULL,
	"clock_skew_seconds" integer NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "tenant_keys" ADD COLUMN "scope" text DEFAULT 'full' NOT NULL;--> statement-breakpoint
ALTER TABLE "tenant_jwt" ADD CONSTRAINT "tenant_jwt_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;