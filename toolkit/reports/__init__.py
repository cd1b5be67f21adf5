"""What people read: report.md and report.html rendered from the typed report, the terminal tables, the
JUnit file, the comparison of several builds (`compare`), what moved between two (`diff`), and the choice
among a project's profiles (`choice`). Renderers are pure functions of records.
"""
