"""The build as one ordered list of steps over one typed build state, and `check` as the tail of the same
list over a build dir opened by the verified reader. Each step declares what it needs from the state and
what it adds; a step never imports a later one.
"""
