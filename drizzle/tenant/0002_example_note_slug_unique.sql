-- lessor:contract
-- EXAMPLE contract step: apps built for schema version 2 may write the same slug twice; only apps
-- built for version 3 handle the unique violation. A tenant whose data already holds a duplicate
-- slug fails here, and only that tenant: fix its rows, then run a campaign again.
ALTER TABLE "notes" ADD CONSTRAINT "notes_slug_unique" UNIQUE("slug");
