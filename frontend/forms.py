"""Sign-in forms for the console and the Django admin, with the lockout of repeated failed sign-ins."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from controlplane.tenancy.selectors import login_locked_seconds
from controlplane.tenancy.services import login_failure_record, login_success_record


class LockoutMixin:
    """Refuses a locked username or address before checking the password; counts failures, clears on success."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        locked = login_locked_seconds(username=username, address=address)
        if locked:
            minutes = max(1, (locked + 59) // 60)
            raise forms.ValidationError(
                f"Too many failed sign-ins for this account or from this address; try again in {minutes} "
                f"minute{'s' if minutes != 1 else ''}.", code="locked_out")
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            if self.get_user() is None:  # the password was wrong (not: right password, no admin access)
                login_failure_record(username=username, address=address)
            raise
        login_success_record(username=username)
        return cleaned


class ConsoleLoginForm(LockoutMixin, AuthenticationForm):
    pass


class AdminLoginForm(LockoutMixin, AdminAuthenticationForm):
    pass
