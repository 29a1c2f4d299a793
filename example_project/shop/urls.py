from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.place_order, name="place_order"),
]
