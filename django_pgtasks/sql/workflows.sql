-- Workflows: a parent's end leaves a release mark; workers release its children in bounded
-- batches (django_pgtasks.lifecycle.release); an operator's retry re-opens the downstream; the
-- commit-time check of a child enqueued after its parents.
--
-- The current definition of each function and trigger of this concern. Migrations apply
-- frozen copies; tests/integration/test_sql.py checks that a migrated database has exactly
-- these. Each definition starts with its `-- name:` line.

-- name: function pgtasks_mark_release
CREATE OR REPLACE FUNCTION pgtasks_mark_release(p_parent bigint, p_status text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtasks_dependency WHERE parent_id = p_parent AND NOT resolved)
    THEN
        INSERT INTO pgtasks_pending_release AS r (parent_id, parent_status, created_at, due_at,
                                                  failures, last_error)
        VALUES (p_parent, p_status, statement_timestamp(), statement_timestamp(), 0, '')
        ON CONFLICT (parent_id) DO UPDATE SET parent_status = EXCLUDED.parent_status,
                                              due_at = EXCLUDED.due_at;
        PERFORM pg_notify('pgtasks', '@release');
    END IF;
END
$function$;

-- Statistics taken while no task waited and every edge was resolved (the common state of a
-- table whose workflows have all ended, and the one autovacuum last saw before a large
-- fan-out arrives) promise the planner no WAITING task and no open edge. A statement that
-- names rows by id *and* tests `status = 'WAITING'` or `NOT resolved` then lets it pick the
-- partial index of that state (pgtasks_task_waiting_idx, pgtasks_dependency_open_idx),
-- "one row" by those statistics, and scan all of it for each batch or each child: 20,000
-- children took 4 s per batch of 1,000 (past an ordinary statement_timeout) instead of
-- 0.05 s. These functions compare with a constant of their own (v_open, v_waiting)
-- instead: a generic plan (plan_cache_mode) cannot know its value, so it cannot use those
-- partial indexes, and each row is one primary-key probe whatever those statistics say.
--
-- Statistics taken after vacuum emptied most pages of a table without truncating it (a
-- quiet period after a large workflow) scale a handful of live rows to the whole table: the
-- planner expects a few edges, members and tasks where a new fan-out put thousands, and any
-- condition to match all of them. A join of the batch with such a table then read the table
-- in full once per row of the batch (9 s for a batch of 1,000 among 10,000 edges), and a
-- lookup by child read a whole index that only gave the order it wanted. So each statement
-- of a batch reads one table (its rows named with `= ANY (array)`, a value that differs per
-- row from a per-row probe of a small table, or one statement per value), sequential scans
-- are off (enable_seqscan: only the index its conditions name is left), and a per-row check
-- keeps to its row (`OFFSET 0` keeps EXISTS from becoming a join or a hash of the whole
-- table, and keeps an ORDER BY from choosing an index for its order alone). Whatever the
-- planner expects, no statement reads more than the rows it names.

-- name: function pgtasks_release
CREATE OR REPLACE FUNCTION pgtasks_release(p_parents bigint[], p_limit integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_edges bigint[];
    v_children bigint[];
    v_count integer;
    v_times integer;
    v_lowered bigint[];
    v_settled bigint[] := '{}';
    v_ready bigint[];
    v_open CONSTANT boolean := false;
    v_waiting CONSTANT text := 'WAITING';
BEGIN
    -- The batch: open edges of the locked marks' parents, through the index of open edges.
    v_edges := ARRAY(
        SELECT d.id
        FROM pgtasks_pending_release r
        CROSS JOIN LATERAL (
            SELECT e.id FROM pgtasks_dependency e
            WHERE e.parent_id = r.parent_id AND NOT e.resolved
            LIMIT p_limit) d
        WHERE r.parent_id = ANY (p_parents)
        LIMIT p_limit);
    -- Each edge takes its parent's end from the mark (locked by the caller: it cannot
    -- change or go before this transaction ends).
    WITH resolved AS (
        UPDATE pgtasks_dependency e SET resolved = true, parent_status = (
            SELECT r.parent_status FROM pgtasks_pending_release r
            WHERE r.parent_id = e.parent_id)
        WHERE e.id = ANY (v_edges) AND e.resolved = v_open
        RETURNING e.child_id
    )
    SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM resolved;
    v_count := coalesce(cardinality(v_children), 0);
    IF v_count > 0 THEN
        PERFORM 1 FROM pgtasks_workflow_member
        WHERE task_id = ANY (v_children) ORDER BY task_id FOR NO KEY UPDATE;
        -- A child is in v_children once per parent of the batch that it waits for: one
        -- statement per such count (almost always only 1).
        FOR v_times, v_lowered IN
            SELECT n, array_agg(child ORDER BY child)
            FROM (SELECT child, count(*)::integer AS n
                  FROM unnest(v_children) AS child GROUP BY child) c
            GROUP BY n
        LOOP
            WITH lowered AS (
                UPDATE pgtasks_workflow_member m SET remaining = m.remaining - v_times
                WHERE m.task_id = ANY (v_lowered)
                RETURNING m.task_id, m.remaining
            )
            SELECT v_settled || ARRAY(SELECT task_id FROM lowered WHERE remaining <= 0)
            INTO v_settled;
        END LOOP;
        IF cardinality(v_settled) > 0 THEN
            -- The common case in two statements: children whose parents all succeeded (or
            -- that run anyway) become READY. The status is compared with v_waiting (above).
            v_ready := ARRAY(
                SELECT m.task_id FROM pgtasks_workflow_member m
                WHERE m.task_id = ANY (v_settled)
                  AND (m.on_parent_failure = 'run' OR NOT EXISTS (
                      SELECT 1 FROM pgtasks_dependency d
                      WHERE d.child_id = m.task_id
                        AND d.parent_status IS DISTINCT FROM 'SUCCESSFUL' OFFSET 0)));
            WITH ready AS (
                UPDATE pgtasks_task t SET status = 'READY', finished_at = NULL,
                                          updated_at = statement_timestamp()
                WHERE t.id = ANY (v_ready) AND t.status = v_waiting
                RETURNING t.id
            )
            SELECT array_agg(id) INTO v_ready FROM ready;
            -- The others end by their policy, each naming the parent that did not succeed.
            v_settled := ARRAY(SELECT unnest(v_settled)
                               EXCEPT SELECT unnest(coalesce(v_ready, '{}')));
            IF cardinality(v_settled) > 0 THEN
                PERFORM pgtasks_settle(v_settled);
            END IF;
        END IF;
    END IF;
    DELETE FROM pgtasks_pending_release r
    WHERE r.parent_id = ANY (p_parents)
      AND NOT EXISTS (SELECT 1 FROM pgtasks_dependency e
                      WHERE e.parent_id = r.parent_id AND NOT e.resolved OFFSET 0);
    RETURN v_count;
END
$function$;

-- name: function pgtasks_settle
CREATE OR REPLACE FUNCTION pgtasks_settle(p_children bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_child record;
    v_failed text;
    v_status text;
    v_waiting CONSTANT text := 'WAITING';
BEGIN
    FOR v_child IN
        SELECT task_id, on_parent_failure FROM pgtasks_workflow_member
        WHERE task_id = ANY (p_children) AND remaining <= 0
        ORDER BY task_id
    LOOP
        SELECT 'task ' || d.parent_id || ' ended ' || coalesce(d.parent_status, 'DELETED')
        INTO v_failed
        FROM (SELECT parent_id, parent_status FROM pgtasks_dependency
              WHERE child_id = v_child.task_id
                AND parent_status IS DISTINCT FROM 'SUCCESSFUL' OFFSET 0) d
        ORDER BY d.parent_id LIMIT 1;
        v_status := CASE WHEN v_failed IS NULL OR v_child.on_parent_failure = 'run' THEN 'READY'
                         WHEN v_child.on_parent_failure = 'fail' THEN 'FAILED'
                         ELSE 'CANCELLED' END;
        UPDATE pgtasks_task SET
            status = v_status,
            finished_at = CASE WHEN v_status = 'READY' THEN NULL
                               ELSE statement_timestamp() END,
            error_text = CASE WHEN v_status = 'READY' THEN error_text
                              ELSE 'django_pgtasks.exceptions.ParentFailed: a task it depends '
                                   || 'on did not succeed (' || v_failed || ').' END,
            updated_at = statement_timestamp()
        WHERE id = v_child.task_id AND status = v_waiting;
    END LOOP;
END
$function$;

-- name: function pgtasks_resolve_child
CREATE OR REPLACE FUNCTION pgtasks_resolve_child(p_child bigint, p_parents bigint[], p_statuses text[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_count integer;
    v_remaining integer;
    v_open CONSTANT boolean := false;
BEGIN
    -- The child's own edges (child_id leads the unique index), each given its parent's end.
    WITH resolved AS (
        UPDATE pgtasks_dependency e SET resolved = true,
                                        parent_status = p_statuses[array_position(p_parents,
                                                                                  e.parent_id)]
        WHERE e.child_id = p_child AND e.parent_id = ANY (p_parents) AND e.resolved = v_open
        RETURNING 1
    )
    SELECT count(*) INTO v_count FROM resolved;
    IF v_count > 0 THEN
        UPDATE pgtasks_workflow_member SET remaining = remaining - v_count
        WHERE task_id = p_child
        RETURNING remaining INTO v_remaining;
        IF v_remaining <= 0 THEN
            PERFORM pgtasks_settle(ARRAY[p_child]);
        END IF;
    END IF;
END
$function$;

-- name: function pgtasks_reopen
CREATE OR REPLACE FUNCTION pgtasks_reopen(p_parents bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    v_todo bigint[] := coalesce(p_parents, '{}');
    v_parent bigint;
    v_children bigint[];
    v_next bigint[];
BEGIN
    WHILE cardinality(v_todo) > 0 LOOP
        v_parent := v_todo[1];
        v_todo := v_todo[2:];
        DELETE FROM pgtasks_pending_release WHERE parent_id = v_parent;
        WITH reopened AS (
            UPDATE pgtasks_dependency SET resolved = false, parent_status = NULL
            WHERE parent_id = v_parent AND resolved
            RETURNING child_id
        )
        SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM reopened;
        CONTINUE WHEN v_children IS NULL;
        UPDATE pgtasks_workflow_member SET remaining = remaining + 1
        WHERE task_id = ANY (v_children);
        WITH waiting AS (
            UPDATE pgtasks_task SET
                status = 'WAITING', attempt = 0, interruptions = 0, started_at = NULL,
                finished_at = NULL, error_text = '', result = NULL, cancel_requested = false,
                updated_at = statement_timestamp()
            WHERE id = ANY (v_children)
              AND status IN ('READY', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED')
            RETURNING id, has_dependents
        )
        SELECT array_agg(id ORDER BY id) INTO v_next FROM waiting WHERE has_dependents;
        IF v_next IS NOT NULL THEN
            v_todo := v_todo || v_next;
        END IF;
    END LOOP;
END
$function$;

-- name: function pgtasks_parent_changed
CREATE OR REPLACE FUNCTION pgtasks_parent_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT EXISTS (SELECT 1 FROM pgtasks_task WHERE id = OLD.id) THEN
            PERFORM pgtasks_mark_release(OLD.id, 'DELETED');
        END IF;
    ELSIF NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') THEN
        PERFORM pgtasks_mark_release(NEW.id, NEW.status::text);
    ELSE
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$function$;

-- The check at the commit of an enqueue, once per child with parents outside its batch: lock
-- the parents it still counts, in id order (a parent that ends, moving to history, while the
-- lock waits makes the lock fail instead of following the row, so lock again where it is
-- now: each failure means that a parent ended meanwhile), flag them has_dependents, and
-- count off those that ended before (or are gone). A parent locked here is remembered for
-- the rest of the transaction, which holds its lock until it commits: one found pending
-- (pgtasks.pending_parents) cannot end before, so the next children that wait only for
-- such parents have nothing to do; one found ended or gone (pgtasks.ended_parents) cannot
-- change but by this transaction, so the next children count it off from its row, read
-- again, with no lock. Either way a large fan-out from an earlier task takes one lock and
-- one subtransaction, not one per child. Each list keeps the 64 most recent: a list that
-- only grew would make each child of 20,000 distinct parents read a longer one. The open
-- edges are found with v_open (above).
-- name: function pgtasks_member_committing
CREATE OR REPLACE FUNCTION pgtasks_member_committing()
 RETURNS trigger
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_parents bigint[];
    v_locked bigint[];
    v_pending bigint[];
    v_ended bigint[];
    v_found bigint[];
    v_tries integer := 0;
    v_open CONSTANT boolean := false;
BEGIN
    v_parents := ARRAY(
        SELECT d.parent_id FROM pgtasks_dependency d
        WHERE d.child_id = NEW.task_id AND d.resolved = v_open);
    v_pending := coalesce(
        nullif(current_setting('pgtasks.pending_parents', true), '')::bigint[], '{}');
    v_ended := coalesce(
        nullif(current_setting('pgtasks.ended_parents', true), '')::bigint[], '{}');
    IF v_parents <@ (v_pending || v_ended) THEN
        v_parents := ARRAY(SELECT unnest(v_parents) INTERSECT SELECT unnest(v_ended));
    ELSE
        LOOP
            BEGIN
                v_locked := ARRAY(
                    SELECT t.id FROM pgtasks_task t WHERE t.id = ANY (v_parents)
                    ORDER BY t.id
                    FOR NO KEY UPDATE OF t);
                EXIT;
            EXCEPTION WHEN serialization_failure THEN
                v_tries := v_tries + 1;
                IF v_tries > 100 THEN
                    RAISE;
                END IF;
            END;
        END LOOP;
        UPDATE pgtasks_task SET has_dependents = true
        WHERE id = ANY (v_locked) AND NOT has_dependents;
        v_found := ARRAY(
            SELECT t.id FROM pgtasks_task t
            WHERE t.id = ANY (v_locked) AND t.status IN ('WAITING', 'READY', 'RUNNING',
                                                         'AWAITING_RETRY'));
        PERFORM set_config('pgtasks.pending_parents', (ARRAY(
            SELECT unnest(v_found) EXCEPT SELECT unnest(v_pending)) || v_pending)[1:64]::text,
            true);
        -- The others have ended, or are gone: counted off below, and remembered.
        v_parents := ARRAY(SELECT unnest(v_parents) EXCEPT SELECT unnest(v_found));
        PERFORM set_config('pgtasks.ended_parents', (ARRAY(
            SELECT unnest(v_parents) EXCEPT SELECT unnest(v_ended)) || v_ended)[1:64]::text,
            true);
    END IF;
    IF cardinality(v_parents) > 0 THEN
        -- Each parent's end, read by its id (a probe per parent): its status, or DELETED
        -- where its row is gone. One that this transaction re-opened is still counted.
        PERFORM pgtasks_resolve_child(NEW.task_id, array_agg(p),
                                      array_agg(coalesce(t.status::text, 'DELETED')))
        FROM unnest(v_parents) AS p
        LEFT JOIN LATERAL (SELECT t.status FROM pgtasks_task t WHERE t.id = p OFFSET 0) t
            ON true
        WHERE t.status IS NULL OR t.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
        HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$function$;

-- name: trigger pgtasks_task_parent_deleted on pgtasks_task_live
CREATE TRIGGER pgtasks_task_parent_deleted AFTER DELETE ON pgtasks_task_live
    FOR EACH ROW
    WHEN (OLD.has_dependents)
    EXECUTE FUNCTION pgtasks_parent_changed();

-- name: trigger pgtasks_member_committing on pgtasks_workflow_member
CREATE CONSTRAINT TRIGGER pgtasks_member_committing AFTER INSERT ON pgtasks_workflow_member
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.remaining > 0 AND NEW.outside_parents)
    EXECUTE FUNCTION pgtasks_member_committing();
