"""REST API of tenancy: teams, memberships, API tokens, audit events."""
