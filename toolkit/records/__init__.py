"""The files tapeout writes and reads back, as typed records: `report.json` / `check.json`, `manifest.json`,
the golden inputs and outputs. A file read back is data from elsewhere: it is validated against these
models before any of it is used.
"""
