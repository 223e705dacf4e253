"""Support tickets for an online store, each written for exactly one team.

A ticket is a greeting, one problem sentence from the label's pool (with concrete
details filled in), an optional detail sentence that does not change the team, and a
closing. The label is the pool the problem came from, so it is right by construction.
"""

from __future__ import annotations

import random

from _common import TOTAL, assign_splits, main, unique

SEED = 20240611
LABELS = ("billing", "technical", "account", "shipping")

PROBLEMS = {
    "billing": [
        "I was charged twice for order {order}, once on the {day} and again the next day.",
        "My credit card was billed ${amount} but the total at checkout said ${amount2}.",
        "I cancelled my {plan} subscription last month and you still charged me ${amount}.",
        "Can I get a refund for order {order}? I returned the {item} two weeks ago and the money never came back.",
        "The invoice for order {order} shows the wrong VAT amount, can you send a corrected invoice?",
        "I want to change the payment method on my {plan} subscription from my old card to PayPal.",
        "Why did the price of my {plan} subscription go up from ${amount2} to ${amount}? Nobody told me about a price change.",
        "There is a charge of ${amount} on my bank statement that I do not recognise.",
        "My coupon code was not applied and I paid the full price of ${amount} for the {item}.",
        "I was promised a refund of ${amount} by one of your agents but it has not arrived on my card.",
        "Please send me a receipt for my last payment, I need it for my expense report.",
        "The payment for order {order} failed but the money was still taken from my account.",
    ],
    "technical": [
        "The app crashes every time I open the {screen} screen on my {device}.",
        "Your website shows error {code} when I try to add the {item} to my cart.",
        "The checkout page just keeps loading forever and never finishes, on {browser} and on my {device}.",
        "After the latest app update the search button does nothing when I tap it.",
        "Product pictures are not loading on the website, I only see grey boxes.",
        "The app freezes on a white screen after the splash logo on my {device}.",
        "I get the message 'Something went wrong ({code})' whenever I open my wishlist.",
        "Notifications stopped working after I updated the app on my {device}.",
        "The size filter on the website is broken, it shows {item}s in every size no matter what I pick.",
        "The barcode scanner in the app does not open the camera on my {device}, it just shows a black screen.",
        "Your website is really slow today and pages time out with error {code}.",
        "The app keeps logging a bug report and closing itself when I scroll the {screen} page.",
    ],
    "account": [
        "I forgot my password and the reset email never arrives.",
        "I cannot log in to my account, it says my username or password is wrong even though it is right.",
        "How do I change the email address on my account to {email}?",
        "My account was locked after too many login attempts, please unlock it.",
        "I never receive the two-factor login code by SMS any more.",
        "Please delete my account and all of my personal data.",
        "Someone else seems to have logged in to my account from another country, I did not do that.",
        "I want to merge my two accounts, one uses {email} and the other my phone number.",
        "How can I change the username on my profile?",
        "I signed up with Google and now I cannot set a normal password for my account.",
        "My account says it is not verified even though I clicked the verification link.",
        "I would like to close my account because I am moving abroad.",
    ],
    "shipping": [
        "My package for order {order} has not arrived yet and it was due on {weekday}.",
        "The tracking number for order {order} has not updated for {n} days.",
        "The {item} arrived damaged, the box was crushed by the courier.",
        "I need to change the delivery address for order {order} before it ships.",
        "The courier says my parcel was delivered but there is nothing at my door.",
        "Do you ship to {country}? I could not choose it at checkout.",
        "My order {order} was split into two parcels and only one has arrived.",
        "The delivery of the {item} is {n} days late, when will it come?",
        "Can I pick up my order {order} at the depot instead of home delivery?",
        "The parcel was sent to my old address, how do I get it redirected?",
        "The tracking page says 'returned to sender' for order {order}, why?",
        "The courier left my package in the rain and the {item} is soaked.",
    ],
}

DETAILS = [
    "I have been a customer for {n} years.",
    "This is the second time I am writing about this.",
    "My name is {name}.",
    "I am using the {device}.",
    "",
    "",
    "",
]
GREETINGS = ["Hi,", "Hello,", "Hello team,", "Good morning,", "Hey there,", "Dear support,", "", ""]
CLOSINGS = ["Thanks.", "Thank you!", "Please help.", "Regards, {name}", "Cheers, {name}", "Can you fix this asap?", ""]

FILL = {
    "order": lambda r: f"#{r.randint(10000, 99999)}",
    "day": lambda r: f"{r.randint(1, 28)}th",
    "amount": lambda r: f"{r.randint(5, 300)}.{r.choice(['00', '99', '49', '50'])}",
    "amount2": lambda r: f"{r.randint(5, 300)}.{r.choice(['00', '99'])}",
    "plan": lambda r: r.choice(["Premium", "Plus", "monthly", "yearly", "family"]),
    "item": lambda r: r.choice(["jacket", "blender", "phone case", "lamp", "backpack", "sneaker", "coffee maker", "desk chair"]),
    "screen": lambda r: r.choice(["orders", "profile", "cart", "home", "settings"]),
    "device": lambda r: r.choice(["iPhone 13", "Samsung Galaxy S22", "Pixel 7", "iPad", "Android tablet"]),
    "code": lambda r: r.choice(["500", "E-1042", "403", "ERR_TIMEOUT", "0x80070005"]),
    "browser": lambda r: r.choice(["Chrome", "Firefox", "Safari", "Edge"]),
    "email": lambda r: f"{r.choice(['anna', 'tom', 'li', 'sara', 'omar'])}{r.randint(1, 99)}@example.com",
    "weekday": lambda r: r.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]),
    "n": lambda r: str(r.randint(2, 9)),
    "country": lambda r: r.choice(["Norway", "Canada", "Iceland", "Switzerland", "Mexico"]),
    "name": lambda r: r.choice(["Anna", "Tom", "Li Wei", "Sara", "Omar", "Jonas", "Priya"]),
}


def fill(template: str, rng: random.Random) -> str:
    values = {k: f(rng) for k, f in FILL.items() if "{" + k + "}" in template}
    return template.format(**values)


def draw(rng: random.Random) -> tuple[dict, dict]:
    label = rng.choice(LABELS)
    parts = [rng.choice(GREETINGS), fill(rng.choice(PROBLEMS[label]), rng), fill(rng.choice(DETAILS), rng), fill(rng.choice(CLOSINGS), rng)]
    ticket = " ".join(p for p in parts if p)
    return {"ticket": ticket}, {"label": label}


def build() -> list[dict]:
    rng = random.Random(SEED)
    return assign_splits("tt", unique(lambda: draw(rng), TOTAL, "ticket"))


if __name__ == "__main__":
    main("ticket_triage", build)
