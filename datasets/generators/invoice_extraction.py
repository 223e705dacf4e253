"""Short invoice emails with five fields to extract.

The generator draws the field values first (vendor, invoice number, subtotal and tax,
currency, due date), writes them into one of several email layouts (with distractors:
an invoice date, a subtotal, a tax line, a customer reference), and uses the drawn
values as the expected JSON, so the answers are right by construction. The total is
subtotal + tax, rounded to cents; the due date is written as ISO in most emails and in
words ("July 5, 2024") in some, and always expected as ISO.
"""

from __future__ import annotations

import datetime as dt
import random

from _common import TOTAL, assign_splits, main, unique

SEED = 20240612
VENDORS = [
    "Acme Office Supplies", "Northwind Traders", "Blue Harbor Logistics", "Greenleaf Catering",
    "Summit IT Services", "Brightline Printing", "Oakridge Cleaning Co.", "Pioneer Software Ltd",
    "Redwood Furniture", "Silverline Telecom", "Harbor View Consulting", "Maple Street Bakery",
    "Nordic Energy AB", "Crescent Legal LLP", "Atlas Security GmbH", "Lakeside Marketing",
]
CUSTOMERS = ["Fernwood Dental", "Kite & Co", "Orbit Labs", "Riverside School", "Tandem Bikes", "Quartz Studio"]
CURRENCIES = {"USD": ["$", "USD "], "EUR": ["€", "EUR "], "GBP": ["£", "GBP "]}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]


def money(symbol: str, value: float) -> str:
    return f"{symbol}{value:,.2f}"


def draw(rng: random.Random) -> tuple[dict, dict]:
    vendor = rng.choice(VENDORS)
    number = rng.choice([
        f"INV-{rng.randint(2023, 2025)}-{rng.randint(1, 9999):04d}",
        f"{rng.randint(100000, 999999)}",
        f"{rng.choice('ABCDKR')}{rng.randint(1000, 99999)}",
    ])
    currency = rng.choice(list(CURRENCIES))
    symbol = rng.choice(CURRENCIES[currency])
    subtotal = round(rng.randint(2000, 500000) / 100, 2)
    tax = round(subtotal * rng.choice([0.0, 0.05, 0.1, 0.2]), 2)
    total = round(subtotal + tax, 2)
    issued = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 330))
    due = issued + dt.timedelta(days=rng.choice([14, 30, 45, 60]))
    due_text = due.isoformat() if rng.random() < 0.7 else f"{MONTHS[due.month - 1]} {due.day}, {due.year}"
    customer = rng.choice(CUSTOMERS)
    ref = f"PO-{rng.randint(1000, 9999)}"
    layout = rng.randrange(3)
    if layout == 0:
        doc = (
            f"From: billing@{vendor.split()[0].lower()}.example\n"
            f"Hello {customer},\nplease find our invoice {number} dated {issued.isoformat()} for your order {ref}.\n"
            f"Subtotal: {money(symbol, subtotal)}\nTax: {money(symbol, tax)}\nTotal due: {money(symbol, total)}\n"
            f"Payment is due by {due_text}.\nKind regards,\n{vendor}"
        )
    elif layout == 1:
        doc = (
            f"INVOICE\nVendor: {vendor}\nInvoice no.: {number}\nInvoice date: {issued.isoformat()}\n"
            f"Bill to: {customer} (ref {ref})\nAmount before tax: {money(symbol, subtotal)}\n"
            f"Amount due: {money(symbol, total)}\nDue date: {due_text}"
        )
    else:
        doc = (
            f"Hi team at {customer}, this is a reminder from {vendor}. Invoice {number} "
            f"(issued {issued.isoformat()}, your reference {ref}) comes to {money(symbol, total)} including "
            f"{money(symbol, tax)} tax. Please pay it by {due_text}. Thank you!"
        )
    expected = {"vendor": vendor, "invoice_number": number, "total": total, "currency": currency, "due_date": due.isoformat()}
    return {"document": doc}, expected


def build() -> list[dict]:
    rng = random.Random(SEED)
    return assign_splits("inv", unique(lambda: draw(rng), TOTAL, "document"))


if __name__ == "__main__":
    main("invoice_extraction", build)
