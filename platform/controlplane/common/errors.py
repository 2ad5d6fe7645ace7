"""Domain errors raised by services; the API layer turns them into 4xx JSON bodies."""

from __future__ import annotations


class DomainError(Exception):
    """A request that cannot be carried out; `field` names the input at fault when there is one."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict:
        if self.field:
            return {self.field: [self.message]}
        return {"detail": self.message}


class ValidationFailed(DomainError):
    status_code = 400
    code = "invalid"


class PermissionDeniedError(DomainError):
    status_code = 403
    code = "permission_denied"


class ConflictError(DomainError):
    """The object is in a state that does not allow the operation (for example deleting a running job)."""

    status_code = 409
    code = "conflict"


class InvalidTransition(ConflictError):
    code = "invalid_transition"
