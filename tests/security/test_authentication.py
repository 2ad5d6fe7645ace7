"""S5 (issue 8): expired, revoked and deleted-user tokens get 401 everywhere; repeated failed sign-ins lock
out (console and admin), per account and per client address, without telling which accounts exist."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from controlplane.tenancy.models import ApiToken, LoginThrottle
from controlplane.tenancy.selectors import (
    LOGIN_MAX_FAILURES_PER_ADDRESS,
    LOGIN_MAX_FAILURES_PER_USER,
)
from controlplane.tenancy.services import api_token_create, api_token_revoke

PASSWORD = "pw-123456789"
# A REST call and a gateway call: both authenticate with the same team tokens.
TOKEN_URLS = [("get", "/api/v1/training-jobs/"), ("get", "/api/v1/me/"), ("get", "/v1/models")]


def _token(world, role="member", **extra):
    user = world["alpha"][role]
    return api_token_create(actor=user, team=world["alpha"]["team"], user=user, name="s5", **extra)


def _statuses(raw: str) -> list[int]:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return [getattr(client, method)(url).status_code for method, url in TOKEN_URLS]


def test_a_live_token_works_and_each_dead_one_is_a_401(world):
    _, live = _token(world)
    assert _statuses(live) == [200, 200, 200]

    expired, raw_expired = _token(world)
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked, raw_revoked = _token(world)
    api_token_revoke(actor=world["alpha"]["admin"], token=revoked)
    _, raw_inactive = _token(world, "viewer")
    get_user_model().objects.filter(pk=world["alpha"]["viewer"].pk).update(is_active=False)
    doomed = get_user_model().objects.create_user("doomed", password=PASSWORD)
    from controlplane.tenancy.services import membership_set

    membership_set(actor=world["alpha"]["admin"], team=world["alpha"]["team"], username="doomed", role="member")
    _, raw_deleted = api_token_create(actor=doomed, team=world["alpha"]["team"], user=doomed, name="s5")
    doomed.delete()

    for label, raw in [("expired", raw_expired), ("revoked", raw_revoked), ("inactive user", raw_inactive),
                       ("deleted user", raw_deleted), ("made up", "fy_" + "x" * 40), ("not ours", "abc")]:
        assert _statuses(raw) == [401, 401, 401], label


def _login(client: Client, username: str, password: str, *, path: str = "/login/", address: str = "10.0.0.1"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_repeated_failures_lock_the_account_even_for_the_right_password(world):
    client = Client()
    for _ in range(LOGIN_MAX_FAILURES_PER_USER):
        wrong = _login(client, "alpha-member", "not-it")
        assert wrong.status_code == 200 and b"correct username and password" in wrong.content
    locked = _login(client, "alpha-member", PASSWORD)
    assert locked.status_code == 200, "a locked account must not sign in"
    assert b"Too many failed sign-ins" in locked.content and b"try again in 15 minutes" in locked.content
    assert "_auth_user_id" not in client.session
    # Another address is locked out of that account too; other accounts from the first address are not.
    assert b"Too many failed sign-ins" in _login(Client(), "alpha-member", PASSWORD, address="10.9.9.9").content
    assert _login(Client(), "alpha-admin", PASSWORD).status_code == 302


def test_the_lock_ends_after_the_lockout_and_success_clears_the_count(world):
    client = Client()
    for _ in range(LOGIN_MAX_FAILURES_PER_USER):
        _login(client, "alpha-member", "not-it")
    LoginThrottle.objects.filter(key="user:alpha-member").update(
        locked_until=timezone.now() - timedelta(seconds=1))
    assert _login(client, "alpha-member", PASSWORD).status_code == 302
    assert not LoginThrottle.objects.filter(key="user:alpha-member").exists()
    # A few failures below the limit, then a success: the count starts again from zero.
    other = Client()
    for _ in range(LOGIN_MAX_FAILURES_PER_USER - 1):
        _login(other, "alpha-admin", "not-it", address="10.0.0.2")
    assert _login(other, "alpha-admin", PASSWORD, address="10.0.0.2").status_code == 302
    for _ in range(LOGIN_MAX_FAILURES_PER_USER - 1):
        _login(Client(), "alpha-admin", "not-it", address="10.0.0.3")
    assert _login(Client(), "alpha-admin", PASSWORD, address="10.0.0.3").status_code == 302


def test_unknown_usernames_lock_the_same_way(db):
    for _ in range(LOGIN_MAX_FAILURES_PER_USER):
        _login(Client(), "nobody-here", "guess")
    assert b"Too many failed sign-ins" in _login(Client(), "nobody-here", "guess").content


def test_one_address_spraying_many_accounts_is_locked(world):
    usernames = [f"user-{n}" for n in range(LOGIN_MAX_FAILURES_PER_ADDRESS)]
    for name in usernames:
        assert b"correct username and password" in _login(Client(), name, "guess", address="10.6.6.6").content
    blocked = _login(Client(), "alpha-member", PASSWORD, address="10.6.6.6")
    assert b"Too many failed sign-ins" in blocked.content
    assert _login(Client(), "alpha-member", PASSWORD, address="10.7.7.7").status_code == 302


def test_the_admin_sign_in_locks_out_too(world):
    client = Client()
    for _ in range(LOGIN_MAX_FAILURES_PER_USER):
        _login(client, "ops", "not-it", path="/admin/login/")
    locked = _login(client, "ops", "pw-ops-123456", path="/admin/login/")
    assert locked.status_code == 200 and b"Too many failed sign-ins" in locked.content
    LoginThrottle.objects.all().delete()
    assert _login(client, "ops", "pw-ops-123456", path="/admin/login/").status_code == 302


def test_a_right_password_without_admin_access_is_not_counted_as_a_failure(world):
    for _ in range(LOGIN_MAX_FAILURES_PER_USER + 1):
        _login(Client(), "alpha-member", PASSWORD, path="/admin/login/")
    assert _login(Client(), "alpha-member", PASSWORD).status_code == 302
