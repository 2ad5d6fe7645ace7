"""`manage.py up`: start the embedded platform (see controlplane.launcher)."""

from django.core.management.base import BaseCommand

from controlplane import launcher


class Command(BaseCommand):
    help = "Migrate, load the demo, start Ray, Celery worker + beat and the web server; Ctrl-C stops all."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-ray", action="store_true",
                            help="use the in-memory compute backend instead of a local Ray cluster")

    def handle(self, *args, host, port, no_ray, **options):
        code = launcher.run(host=host, port=port, with_ray=not no_ray)
        if code:
            raise SystemExit(code)
