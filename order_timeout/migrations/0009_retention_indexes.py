# The indexes the prune deletes by age along. Built without blocking writes to the table:
# concurrently on PostgreSQL (so this migration is not atomic), online on MariaDB and MySQL.

from django.db import migrations, models

from order_timeout.db.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('order_timeout', '0008_deadletter_timer_db_default'),
    ]

    operations = [
        AddIndexOnline(
            model_name='deadletter',
            index=models.Index(fields=['resolved_at'], name='order_timeout_deadletter_age'),
        ),
        AddIndexOnline(
            model_name='reminder',
            index=models.Index(fields=['deadline'], name='order_timeout_reminder_age'),
        ),
    ]
