CREATE TABLE "tenant_keys" (
	"tenant_id" text NOT NULL,
	"key_id" text NOT NULL,
	"key_hash" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"expires_at" timestamp with time zone,
	"revoked_at" timestamp with time zone,
	"last_used_at" timestamp with time zone,
	CONSTRAINT "tenant_keys_tenant_id_key_id_pk" PRIMARY KEY("tenant_id","key_id")
);
