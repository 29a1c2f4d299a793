"""Numbers about the queue: statistics, the dashboard's snapshot and Prometheus metrics."""
