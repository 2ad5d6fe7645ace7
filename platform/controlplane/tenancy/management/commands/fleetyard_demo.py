"""`manage.py fleetyard_demo`: load the demo setup (idempotent) and print the demo login."""

from django.core.management.base import BaseCommand

from controlplane.demo import load_demo


class Command(BaseCommand):
    help = "Load the demo node pools, queues, teams and user (safe to run again)."

    def handle(self, *args, **options):
        login = load_demo()
        self.stdout.write(f"demo login: {login.username} / {login.password}")
