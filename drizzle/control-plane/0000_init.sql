CREATE TABLE "generation_ledger" (
	"tenant_id" text NOT NULL,
	"generation" integer NOT NULL,
	"pool_size" integer NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "generation_ledger_tenant_id_generation_pk" PRIMARY KEY("tenant_id","generation")
);
--> statement-breakpoint
CREATE TABLE "lifecycle_events" (
	"tenant_id" text NOT NULL,
	"seq" bigint NOT NULL,
	"generation" integer NOT NULL,
	"from_state" text NOT NULL,
	"to_state" text NOT NULL,
	"reason" text NOT NULL,
	"at" timestamp with time zone NOT NULL,
	CONSTRAINT "lifecycle_events_tenant_id_seq_pk" PRIMARY KEY("tenant_id","seq")
);
--> statement-breakpoint
CREATE TABLE "tenant_credentials" (
	"tenant_id" text PRIMARY KEY NOT NULL,
	"sealed_password" text NOT NULL,
	"sealed_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "tenants" (
	"id" text PRIMARY KEY NOT NULL,
	"ordinal" bigint GENERATED ALWAYS AS IDENTITY (sequence name "tenants_ordinal_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"status" text NOT NULL,
	"tier" text NOT NULL,
	"host" text NOT NULL,
	"database_name" text NOT NULL,
	"role_name" text NOT NULL,
	"key_hash" text,
	"schema_version" integer DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "tenants_ordinal_unique" UNIQUE("ordinal")
);
--> statement-breakpoint
ALTER TABLE "tenant_credentials" ADD CONSTRAINT "tenant_credentials_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "lifecycle_events_at" ON "lifecycle_events" USING btree ("at");