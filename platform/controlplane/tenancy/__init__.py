"""Tenancy: teams, memberships with roles, hashed API tokens and the audit log."""
