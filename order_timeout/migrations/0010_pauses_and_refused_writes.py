# Staff in control: the pauses of a timer (who, when, why, what was given back), and the writes the
# app refused (a stale save over an acted-on row, a payment after the close). New tables only.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('order_timeout', '0009_retention_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Pause',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('timer', models.CharField(max_length=64, verbose_name='timer')),
                ('open_for', models.CharField(blank=True, editable=False, max_length=64, null=True, unique=True, verbose_name='open for')),
                ('reason', models.TextField(verbose_name='reason')),
                ('paused_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='paused at')),
                ('resumed_at', models.DateTimeField(blank=True, null=True, verbose_name='resumed at')),
                ('given_back_seconds', models.FloatField(blank=True, null=True, verbose_name='seconds given back')),
                ('given_back_rows', models.PositiveIntegerField(default=0, verbose_name='rows given back')),
                ('give_back_after', models.CharField(blank=True, default='', editable=False, max_length=64, verbose_name='given back up to')),
                ('paused_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='paused by')),
                ('resumed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='resumed by')),
            ],
            options={
                'verbose_name': 'pause',
                'verbose_name_plural': 'pauses',
                'ordering': ['-paused_at'],
                'permissions': [('pause_timers', 'Can pause and resume timers')],
            },
        ),
        migrations.CreateModel(
            name='RefusedWrite',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(max_length=100, verbose_name='model')),
                ('object_id', models.CharField(max_length=64, verbose_name='object id')),
                ('timer', models.CharField(max_length=64, verbose_name='timer')),
                ('refusal', models.CharField(choices=[('stale_save', "A stale copy's save over an acted-on row"), ('paid_after_close', 'Paid after its deadline closed it')], max_length=32, verbose_name='refusal')),
                ('values', models.JSONField(blank=True, default=dict, verbose_name='values it tried to write')),
                ('at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='at')),
                ('handled_at', models.DateTimeField(blank=True, null=True, verbose_name='handled at')),
                ('handled_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL, verbose_name='handled by')),
            ],
            options={
                'verbose_name': 'refused write',
                'verbose_name_plural': 'refused writes',
                'ordering': ['-at'],
                'indexes': [models.Index(fields=['model', 'object_id'], name='order_timeout_refused_row'), models.Index(fields=['handled_at'], name='order_timeout_refused_age')],
            },
        ),
    ]
