"""Build dirs on disk: a build is staged in a hidden sibling directory and swapped into place whole
(`staging`), and every command that reads one goes through the one verified reader (`reader`): the
manifest validated, every file it uses checked against its hash, every path confined to the build dir.
"""
