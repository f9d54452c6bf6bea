# The column 0005 added, given a database default: a consumer or scan of 0.2 still running
# beside 0.3 (a rolling upgrade) writes its dead letters without naming it.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('order_timeout', '0007_queue_epoch'),
    ]

    operations = [
        migrations.AlterField(
            model_name='deadletter',
            name='timer',
            field=models.CharField(blank=True, db_default='', default='', max_length=64, verbose_name='timer'),
        ),
    ]
