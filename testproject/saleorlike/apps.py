from django.apps import AppConfig


class SaleorlikeConfig(AppConfig):
    name = "testproject.saleorlike"
    default_auto_field = "django.db.models.AutoField"
