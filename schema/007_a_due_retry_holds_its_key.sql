-- outbox-relay schema, version 7: a retry that has fallen due still holds its key back from a
-- poll. Placeholders as in 001. Runs in one transaction; replaces function bodies only (no table
-- lock, writers keep running).
--
-- The bug. The claim lets an event through only if no earlier event of its key waits for a retry
-- (head-of-line per key): a row with attempts > 0 AND next_attempt_at > now(). Once that retry R
-- falls due, the predicate no longer sees it; the relay's runner claims it again a few tens of
-- milliseconds later. A poll in between (p_probe) looks only above what earlier claims covered,
-- which R is below: it did not take R, and it took a later event L of R's key, so L reached the
-- sink before R (tests/integration/test_webhook.py, test_8). A claim without p_probe starts at the
-- bottom and takes R before L, in id order, as before.
--
-- The fix. For a poll, every earlier event of the key that has failed and is still pending holds
-- it back, due or not: `attempts > 0 AND (p_probe OR next_attempt_at > now())`, in the check
-- whether anything waits for a retry and in the per-row head-of-line check. The runner's claim
-- (p_probe false) takes R and then L. This costs a poll nothing while no event has failed.
--
-- Schemas 3 and 5 wrote the predicate in their claim functions; both are patched here, from their
-- definitions as installed, so a relay binary of any schema version gets the fix (schema 3's
-- 11-argument claim calls its 12-argument one). A definition without the predicate stops this
-- migration with an error rather than leaving the hole unnoticed.

DO $probe_waits_for_due_retry$
DECLARE
  v_sig text;
  v_fn  regprocedure;
  v_def text;
  v_new text;
BEGIN
  FOREACH v_sig IN ARRAY ARRAY[
    -- schema 3's claim with a floor
    '{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, text[], bigint)',
    -- schema 5's claim, lane by lane
    '{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[])']
  LOOP
    v_fn := to_regprocedure(v_sig);
    CONTINUE WHEN v_fn IS NULL;
    v_def := pg_get_functiondef(v_fn);
    v_new := replace(replace(v_def,
               'w.attempts > 0 AND w.next_attempt_at > now()', 'w.attempts > 0 AND (p_probe OR w.next_attempt_at > now())'),
               'b.attempts > 0 AND b.next_attempt_at > now()', 'b.attempts > 0 AND (p_probe OR b.next_attempt_at > now())');
    IF v_new NOT LIKE '%w.attempts > 0 AND (p_probe OR w.next_attempt_at > now())%'
       OR v_new NOT LIKE '%b.attempts > 0 AND (p_probe OR b.next_attempt_at > now())%' THEN
      RAISE EXCEPTION 'outbox-relay: % does not hold the head-of-line check schema 7 patches', v_fn
        USING HINT = 'the function was changed by hand; restore it from schema/ (003 or 005) and migrate again';
    END IF;
    IF v_new <> v_def THEN
      EXECUTE v_new;  -- CREATE OR REPLACE: same owner, same grants
    END IF;
  END LOOP;
END
$probe_waits_for_due_retry$;
