"""The peers' side of the benchmark. These modules run in bench/.venv-peers only."""
