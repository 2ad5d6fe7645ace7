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


class RateLimited(DomainError):
    """Too many requests of one kind in a window (429); `retry_after` is how many seconds until one is accepted
    again, sent as the Retry-After header."""

    status_code = 429
    code = "throttled"

    def __init__(self, message: str, *, retry_after: int, field: str | None = None):
        super().__init__(message, field=field)
        self.retry_after = max(1, int(retry_after))
