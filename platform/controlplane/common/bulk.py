"""Write many rows' changed fields in a few statements (the scheduling cycle writes hundreds of jobs at once).

`write_fields(objs, fields)` saves `fields` of every object, each with its own values, as
``UPDATE t SET f = v.columnN ... FROM (VALUES (...), ...) AS v WHERE t.pk = v.column1``, BATCH rows per
statement: PostgreSQL and SQLite 3.33+ run it (on PostgreSQL each value is cast to its column's type; SQLite takes
values as they come). Django's bulk_update builds a CASE expression per row and field in Python: about 3 s for
5,000 rows of two fields, as long as one UPDATE per row. Older SQLite falls back to one UPDATE per row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from django.db import connection, models

BATCH = 300  # rows per statement (x fields + 1 parameters: old SQLite allows 999 per statement)


def write_fields(objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    if connection.vendor == "sqlite" and sqlite3.sqlite_version_info < (3, 33):  # no UPDATE ... FROM
        for obj in objs:
            model.objects.filter(pk=obj.pk).update(**{name: getattr(obj, name) for name in fields})
        return
    quote = connection.ops.quote_name
    table, key = quote(meta.db_table), quote(meta.pk.column)
    typed = connection.vendor == "postgresql"

    def slot(field) -> str:
        if not typed:
            return "%s"
        kind = field.db_type(connection)
        # A too-long string must fail as the ORM's UPDATE does: CAST(... AS varchar(n)) would cut it silently;
        # text assigned to the varchar(n) column raises.
        return f"CAST(%s AS {'text' if kind.startswith('varchar') else kind})"

    row = "(" + ", ".join(slot(field) for field in [meta.pk, *columns]) + ")"
    sets = ", ".join(f"{quote(field.column)} = v.column{i + 2}" for i, field in enumerate(columns))
    per_batch = max(1, min(BATCH, 900 // (len(columns) + 1)))
    with connection.cursor() as cursor:
        for start in range(0, len(objs), per_batch):
            batch = objs[start:start + per_batch]
            values = []
            for obj in batch:
                values.append(meta.pk.get_db_prep_save(obj.pk, connection))
                values += [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in columns]
            rows = ", ".join([row] * len(batch))
            sql = f"UPDATE {table} SET {sets} FROM (VALUES {rows}) AS v WHERE {table}.{key} = v.column1"  # noqa: S608 - names from _meta, values are parameters  # nosec B608
            cursor.execute(sql, values)
