CREATE TABLE "usage_deltas" (
	"tenant_id" text NOT NULL,
	"seq" bigint NOT NULL,
	"queries" bigint NOT NULL,
	"rows_returned" bigint NOT NULL,
	"errors" bigint NOT NULL,
	"lease_ms" bigint NOT NULL,
	"pool_starts" bigint NOT NULL,
	"at" timestamp with time zone NOT NULL,
	CONSTRAINT "usage_deltas_tenant_id_seq_pk" PRIMARY KEY("tenant_id","seq")
);
