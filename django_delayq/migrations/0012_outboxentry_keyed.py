from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_delayq', '0011_job_missing_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxentry',
            name='keyed',
            field=models.TextField(blank=True, db_default='', default='', verbose_name='flow-control keys'),
        ),
    ]
