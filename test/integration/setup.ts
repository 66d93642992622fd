/**
 * Runs before each workers test file, in the Worker's isolate: the hosts' sweep alarms
 * (src/budget-object/sweep.ts) start off, so that a file's own reconcile, orphan reaper or
 * hygiene call is the only one that runs, at the moment the file says. The files that test the
 * sweep (idle-hour.test.ts) turn it on.
 */
import { budgetHooksForTests } from "../../src/budget-object/test-hooks.ts";

budgetHooksForTests.sweep = "off";
