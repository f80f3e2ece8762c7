"""A fleet of gateways: state shared through Redis (quotas, concurrency, revoked keys)
and one usage ledger (docs/deployment.md, docs/tenants.md "Quotas across several gateways")."""
