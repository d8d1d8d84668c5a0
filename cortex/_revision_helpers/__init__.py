"""Code the Alembic revisions run, frozen so a released revision always does the same.

Each module is named with a version suffix (``ddl_v1``) and never changes once
released (tests/unit/test_revision_snapshots.py pins its digest); a changed
behaviour goes into a new ``_v2`` module, which only new revisions import.
"""
