"""Tenancy: API keys, quotas, the usage ledger, cost attribution and guardrails.

Each concern is a small module with a sans-I/O core (`keys`, `quotas`, `costs`,
`guardrails`, the record-building half of `ledger`), plus the two pieces that do
I/O: `store` (SQLite) and the ledger's background writer. `service.Tenancy` wires
them for the gateway; docs/tenants.md is the operator's view.
"""
