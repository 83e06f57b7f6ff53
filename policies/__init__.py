"""Pure placement rules from the seed design documents.

Each module is a set of small pure functions over desired-state models and
plain observed facts: slot eligibility, node capability and mode, topology
fit per GPU count, fabric compatibility, VM profile resolution. No I/O, no
clock, no database; table tests pin every rule.
"""
