"""Desired state: the typed kinds an operator or the portal bot commits to git.

This package is pure: it reads YAML text (from a directory or a git revision),
turns it into frozen models, and reports every problem with file, line, column
and a stable code. It never talks to a database, libvirt or the host network.
"""
