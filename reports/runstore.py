# old home of these names, while bench/ and tests/test_engine_plan.py import them here
from kog.runstore import git_commit, open_run, package_versions, source_digest  # noqa: F401
