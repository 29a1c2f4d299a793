"""Workflows: tasks that wait for other tasks to end (django_pgtasks.models.dependencies).

- ``pgtasks_task`` gets the state ``WAITING`` (outside the claim index's range, counted per
  queue by ``pgtasks_task_waiting_idx``) and the flag ``has_dependents``; the check of the states is replaced without a long lock (added
  ``NOT VALID``, then validated, which does not block writes).
- ``pgtasks_dependency`` (one edge per parent) and ``pgtasks_workflow_member`` (a task's
  workflow and its count of parents not ended). Their rows go with their task, through
  triggers on DELETE and TRUNCATE (the purge deletes with SQL, not the ORM).
- The functions and triggers that release a task in the transaction that ends its last
  parent, and the deferred check at the enqueuing transaction's commit. Their text is frozen
  here, as it was when this migration was written.
"""

import django.db.models.deletion
from django.db import migrations, models

STATUS_CHECK = """
ALTER TABLE pgtasks_task DROP CONSTRAINT pgtasks_task_status_valid;
ALTER TABLE pgtasks_task ADD CONSTRAINT pgtasks_task_status_valid CHECK (status IN (
    'WAITING', 'READY', 'RUNNING', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED'))
    NOT VALID;
ALTER TABLE pgtasks_task VALIDATE CONSTRAINT pgtasks_task_status_valid;
"""

STATUS_CHECK_REVERSE = """
ALTER TABLE pgtasks_task DROP CONSTRAINT pgtasks_task_status_valid;
ALTER TABLE pgtasks_task ADD CONSTRAINT pgtasks_task_status_valid CHECK (status IN (
    'READY', 'RUNNING', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED'));
"""

# A task's edges and membership go with it, whatever deletes it (the purge and the archive
# delete with SQL): one statement-level trigger per DELETE, which reads the deleted ids from
# its transition table. A TRUNCATE of the task table empties both tables too. (Foreign keys
# would refuse a plain TRUNCATE pgtasks_task, and check each deleted row on its own.)
CASCADES = """
CREATE FUNCTION pgtasks_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgtasks_dependency d USING pgtasks_deleted_tasks g WHERE d.child_id = g.id;
    DELETE FROM pgtasks_workflow_member m USING pgtasks_deleted_tasks g WHERE m.task_id = g.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION pgtasks_tasks_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- DELETE, not TRUNCATE: a TRUNCATE naming these tables too (Django's flush) is running.
    DELETE FROM pgtasks_dependency;
    DELETE FROM pgtasks_workflow_member;
    RETURN NULL;
END
$$;

CREATE TRIGGER pgtasks_task_deleted
    AFTER DELETE ON pgtasks_task
    REFERENCING OLD TABLE AS pgtasks_deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_deleted();

CREATE TRIGGER pgtasks_task_truncated
    AFTER TRUNCATE ON pgtasks_task
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_truncated();
"""

CASCADES_REVERSE = """
DROP TRIGGER IF EXISTS pgtasks_task_truncated ON pgtasks_task;
DROP TRIGGER IF EXISTS pgtasks_task_deleted ON pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_tasks_truncated();
DROP FUNCTION IF EXISTS pgtasks_tasks_deleted();
"""

RELEASE = r"""
-- Every statement below finds its rows through an index from the ids it is given (= ANY of
-- an array, or one id): these run once per ended parent, in the outcome's transaction, and a
-- join the planner turned into a scan of a large table would cost every outcome.

-- Settle the waiting tasks among p_children that have no parent left to wait for: READY if
-- every parent succeeded or its policy is 'run', else CANCELLED ('skip') or FAILED ('fail'),
-- naming the parent (of the lowest id) that did not succeed. Ending a task here is an end
-- its own dependents see, through the trigger below.
CREATE FUNCTION pgtasks_settle(p_children bigint[]) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_child record;
    v_failed text;
    v_status text;
BEGIN
    -- One simple statement per child (most calls settle one): each keeps one cached plan,
    -- where a join of the three tables would be planned anew on every call.
    FOR v_child IN
        SELECT task_id, on_parent_failure FROM pgtasks_workflow_member
        WHERE task_id = ANY (p_children) AND remaining <= 0
        ORDER BY task_id
    LOOP
        -- The order of the unique index (child_id, parent_id): ORDER BY id LIMIT 1 would walk
        -- the primary key of the whole table when every parent succeeded.
        SELECT 'task ' || parent_id || ' ended ' || coalesce(parent_status, 'DELETED')
        INTO v_failed
        FROM pgtasks_dependency
        WHERE child_id = v_child.task_id AND parent_status IS DISTINCT FROM 'SUCCESSFUL'
        ORDER BY child_id, parent_id LIMIT 1;
        v_status := CASE WHEN v_failed IS NULL OR v_child.on_parent_failure = 'run' THEN 'READY'
                         WHEN v_child.on_parent_failure = 'fail' THEN 'FAILED'
                         ELSE 'CANCELLED' END;
        UPDATE pgtasks_task SET
            status = v_status,
            finished_at = CASE WHEN v_status = 'READY' THEN NULL ELSE now() END,
            error_text = CASE WHEN v_status = 'READY' THEN error_text
                              ELSE 'django_pgtasks.exceptions.ParentFailed: a task it depends '
                                   || 'on did not succeed (' || v_failed || ').' END,
            updated_at = now()
        WHERE id = v_child.task_id AND status = 'WAITING';
    END LOOP;
END
$$;

-- Parents p_parents ended (p_statuses: how): each one's unresolved edges record it and are
-- counted off their children (a child's member row serializes the ends of its parents, so
-- exactly one of them brings the count to zero), and the children with none left are
-- settled.
CREATE FUNCTION pgtasks_resolve(p_parents bigint[], p_statuses text[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_children bigint[];
    v_settled bigint[];
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_parents, 1), 0) LOOP
        WITH resolved AS (
            UPDATE pgtasks_dependency SET resolved = true, parent_status = p_statuses[i]
            WHERE parent_id = p_parents[i] AND NOT resolved
            RETURNING child_id
        )
        SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM resolved;
        CONTINUE WHEN v_children IS NULL;
        WITH lowered AS (
            UPDATE pgtasks_workflow_member SET remaining = remaining - 1
            WHERE task_id = ANY (v_children)
            RETURNING task_id, remaining
        )
        SELECT array_agg(task_id ORDER BY task_id) INTO v_settled
        FROM lowered WHERE remaining <= 0;
        IF v_settled IS NOT NULL THEN
            PERFORM pgtasks_settle(v_settled);
        END IF;
    END LOOP;
END
$$;

-- Parents p_parents ended before and wait or run again (an operator's retry): their edges are
-- unresolved and counted back onto their children, and children that were released or ended
-- wait again with their attempts afresh (an ended child re-opens its own children in turn).
-- A child running at that moment is left to finish.
CREATE FUNCTION pgtasks_reopen(p_parents bigint[]) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_children bigint[];
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_parents, 1), 0) LOOP
        WITH reopened AS (
            UPDATE pgtasks_dependency SET resolved = false, parent_status = NULL
            WHERE parent_id = p_parents[i] AND resolved
            RETURNING child_id
        )
        SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM reopened;
        CONTINUE WHEN v_children IS NULL;
        UPDATE pgtasks_workflow_member SET remaining = remaining + 1
        WHERE task_id = ANY (v_children);
        UPDATE pgtasks_task SET
            status = 'WAITING', attempt = 0, interruptions = 0, started_at = NULL,
            finished_at = NULL, error_text = '', result = NULL, cancel_requested = false,
            updated_at = now()
        WHERE id = ANY (v_children)
          AND status IN ('READY', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED');
    END LOOP;
END
$$;

-- A task that has dependents crossed between not ended and ended (or was deleted before it
-- ended): resolve or re-open its edges, in the transaction that changed it.
CREATE FUNCTION pgtasks_parent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pgtasks_resolve(ARRAY[OLD.id], ARRAY['DELETED']);
    ELSIF NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') THEN
        PERFORM pgtasks_resolve(ARRAY[NEW.id], ARRAY[NEW.status::text]);
    ELSE
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;

-- At the commit of a transaction that enqueued a task with parents saved before it (parents
-- enqueued in the same transaction cannot end before it commits): lock the parents it still
-- counts, in id order, and flag them has_dependents, so that a worker ending one of them now
-- waits for this commit and then sees this task's edges (its trigger reads them with a fresh
-- snapshot); count off those that ended before the lock (or are gone).
CREATE FUNCTION pgtasks_member_committing() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_parents bigint[];
BEGIN
    v_parents := ARRAY(
        SELECT d.parent_id FROM pgtasks_dependency d
        WHERE d.child_id = NEW.task_id AND NOT d.resolved);
    v_parents := ARRAY(
        SELECT t.id FROM pgtasks_task t WHERE t.id = ANY (v_parents)
        ORDER BY t.id
        FOR NO KEY UPDATE OF t);
    UPDATE pgtasks_task SET has_dependents = true
    WHERE id = ANY (v_parents) AND NOT has_dependents;
    PERFORM pgtasks_resolve(array_agg(t.id), array_agg(t.status::text))
    FROM pgtasks_task t
    WHERE t.id = ANY (v_parents) AND t.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
    HAVING count(*) > 0;
    PERFORM pgtasks_resolve(array_agg(d.parent_id), array_agg('DELETED'::text))
    FROM pgtasks_dependency d
    WHERE d.child_id = NEW.task_id AND NOT d.resolved AND NOT (d.parent_id = ANY (v_parents))
    HAVING count(*) > 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER pgtasks_task_parent_changed
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.has_dependents
          AND (OLD.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED'))
              <> (NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')))
    EXECUTE FUNCTION pgtasks_parent_changed();

CREATE TRIGGER pgtasks_task_parent_deleted
    AFTER DELETE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.has_dependents AND OLD.status NOT IN ('SUCCESSFUL', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION pgtasks_parent_changed();

CREATE CONSTRAINT TRIGGER pgtasks_member_committing
    AFTER INSERT ON pgtasks_workflow_member
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.remaining > 0 AND NEW.outside_parents)
    EXECUTE FUNCTION pgtasks_member_committing();
"""

RELEASE_REVERSE = """
DROP TRIGGER IF EXISTS pgtasks_member_committing ON pgtasks_workflow_member;
DROP TRIGGER IF EXISTS pgtasks_task_parent_deleted ON pgtasks_task;
DROP TRIGGER IF EXISTS pgtasks_task_parent_changed ON pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_member_committing();
DROP FUNCTION IF EXISTS pgtasks_parent_changed();
DROP FUNCTION IF EXISTS pgtasks_reopen(bigint[]);
DROP FUNCTION IF EXISTS pgtasks_resolve(bigint[], text[]);
DROP FUNCTION IF EXISTS pgtasks_settle(bigint[]);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgtasks", "0012_runtime_schedules"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("resolved", models.BooleanField(default=False, verbose_name="parent ended")),
                (
                    "parent_status",
                    models.CharField(
                        blank=True,
                        help_text="SUCCESSFUL, FAILED or CANCELLED; DELETED for a parent deleted before it ended.",
                        max_length=16,
                        null=True,
                        verbose_name="how the parent ended",
                    ),
                ),
            ],
            options={
                "verbose_name": "dependency",
                "verbose_name_plural": "dependencies",
                "db_table": "pgtasks_dependency",
            },
        ),
        migrations.CreateModel(
            name="WorkflowMember",
            fields=[
                (
                    "task",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="workflow_member",
                        serialize=False,
                        to="django_pgtasks.task",
                    ),
                ),
                ("workflow_id", models.UUIDField(db_index=True, verbose_name="workflow")),
                (
                    "remaining",
                    models.IntegerField(
                        default=0,
                        help_text="Parents that have not ended yet; the task is released at zero.",
                        verbose_name="parents not ended",
                    ),
                ),
                (
                    "outside_parents",
                    models.BooleanField(
                        db_default=False,
                        default=False,
                        help_text="Some of its parents existed before it was enqueued: they are checked again at the enqueuing transaction's commit.",
                        verbose_name="waits for earlier tasks",
                    ),
                ),
                (
                    "on_parent_failure",
                    models.CharField(
                        choices=[
                            ("run", "run anyway"),
                            ("skip", "skip (cancelled)"),
                            ("fail", "fail"),
                        ],
                        default="skip",
                        max_length=8,
                        verbose_name="if a parent does not succeed",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="created")),
            ],
            options={
                "verbose_name": "workflow member",
                "verbose_name_plural": "workflow members",
                "db_table": "pgtasks_workflow_member",
            },
        ),
        migrations.AddField(
            model_name="archivedtask",
            name="has_dependents",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Other tasks wait for this one to end (django_pgtasks.models.dependencies).",
                verbose_name="has dependents",
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="has_dependents",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Other tasks wait for this one to end (django_pgtasks.models.dependencies).",
                verbose_name="has dependents",
            ),
        ),
        migrations.AlterField(
            model_name="archivedtask",
            name="status",
            field=models.CharField(
                choices=[
                    ("WAITING", "Waiting for parents"),
                    ("READY", "Ready"),
                    ("RUNNING", "Running"),
                    ("AWAITING_RETRY", "Awaiting retry"),
                    ("SUCCESSFUL", "Successful"),
                    ("FAILED", "Failed"),
                    ("CANCELLED", "Cancelled"),
                ],
                default="READY",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="status",
            field=models.CharField(
                choices=[
                    ("WAITING", "Waiting for parents"),
                    ("READY", "Ready"),
                    ("RUNNING", "Running"),
                    ("AWAITING_RETRY", "Awaiting retry"),
                    ("SUCCESSFUL", "Successful"),
                    ("FAILED", "Failed"),
                    ("CANCELLED", "Cancelled"),
                ],
                default="READY",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AddField(
            model_name="dependency",
            name="child",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="dependencies",
                to="django_pgtasks.task",
            ),
        ),
        migrations.AddField(
            model_name="dependency",
            name="parent",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="dependents",
                to="django_pgtasks.task",
            ),
        ),
        migrations.AddConstraint(
            model_name="dependency",
            constraint=models.UniqueConstraint(
                fields=("child", "parent"), name="pgtasks_dependency_uniq"
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(STATUS_CHECK, STATUS_CHECK_REVERSE)],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="task",
                    name="pgtasks_task_status_valid",
                ),
                migrations.AddConstraint(
                    model_name="task",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "WAITING",
                                    "READY",
                                    "RUNNING",
                                    "AWAITING_RETRY",
                                    "SUCCESSFUL",
                                    "FAILED",
                                    "CANCELLED",
                                ],
                            )
                        ),
                        name="pgtasks_task_status_valid",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "WAITING")),
                fields=["queue"],
                name="pgtasks_task_waiting_idx",
            ),
        ),
        migrations.RunSQL(CASCADES, CASCADES_REVERSE),
        migrations.RunSQL(RELEASE, RELEASE_REVERSE),
    ]
