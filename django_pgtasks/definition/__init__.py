"""What a task is: handlers and their registry, options, payloads, schedules, routing.

Values and rules that know no table, no worker and no pattern: what ``@pgtask`` makes of a
function (:mod:`.handlers`, :mod:`.registry`), the checks of enqueue options (:mod:`.options`)
and of JSON payloads (:mod:`.payload`), ``every()``/``cron()`` arithmetic (:mod:`.recurrence`),
which database holds a queue (:mod:`.routing`), the stored error texts (:mod:`.error_text`),
where Django's tasks framework lives (:mod:`.framework`), the read-only shape of a task row
(:mod:`.task_row`) and the registry of maintenance jobs (:mod:`.maintenance_jobs`).
"""
