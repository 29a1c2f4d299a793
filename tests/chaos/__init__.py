"""Fault and load tests: killed workers and backends, held locks, a restarted server, many
threads and processes."""
