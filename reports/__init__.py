"""kog.reports: the run store every command writes, and self-contained HTML reports of its runs."""
