"""DRF authentication with team API tokens: `Authorization: Bearer fy_...` (or `Token fy_...`)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from controlplane.tenancy.services import api_token_authenticate


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        token = api_token_authenticate(raw=header[1].decode(errors="replace"))
        if token is None:
            raise exceptions.AuthenticationFailed("token is invalid, expired or revoked")
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="fleetyard"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "teamToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A team API token (fy_...)."}
