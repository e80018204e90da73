from datetime import date

from .models import Loan, overdue

DAILY_FEE_CENTS = 25
MAX_FEE_CENTS = 1000


def late_days(loan: Loan, today: date) -> int:
    """Days past the due date, 0 when not overdue."""
    if not overdue(loan, today):
        return 0
    return (today - loan.due).days


def fee_cents(loan: Loan, today: date) -> int:
    """The late fee of one loan, capped at MAX_FEE_CENTS."""
    return min(late_days(loan, today) * DAILY_FEE_CENTS, MAX_FEE_CENTS)
