from decimal import Decimal

from django import forms


class OrderForm(forms.Form):
    name = forms.CharField(max_length=200)
    email = forms.EmailField()
    total = forms.DecimalField(max_digits=10, decimal_places=2, min_value=Decimal("0.01"))
