"""The benchmark's Django app: its tasks.py holds the jobs the django-delayq worker runs."""
