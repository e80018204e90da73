from datetime import date, timedelta

from .errors import LoanLimitReached, NotOnShelf
from .fees import MAX_FEE_CENTS, fee_cents, late_days
from .models import Book, Loan, Member, overdue
from .store import Catalog

LOAN_DAYS = 21


class Desk:
    """The lending desk: checks limits, lends and takes back books."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def join(self, member_id: int, name: str) -> Member:
        member = Member(member_id=member_id, name=name)
        self.catalog.members[member_id] = member
        return member

    def stock(self, isbn: str, title: str, copies: int = 1) -> None:
        self.catalog.add_book(Book(isbn=isbn, title=title, copies=copies))

    def lend(self, isbn: str, member_id: int, today: date) -> Loan:
        member = self.catalog.members[member_id]
        if len(self.catalog.loans_of(member_id)) >= member.max_loans:
            raise LoanLimitReached(member.name)
        book = self.catalog.take_copy(isbn)
        loan = Loan(isbn=book.isbn, member_id=member.member_id, due=today + timedelta(days=LOAN_DAYS))
        self.catalog.loans.append(loan)
        return loan

    def try_lend(self, isbn: str, member_id: int, today: date) -> Loan | None:
        try:
            return self.lend(isbn, member_id, today)
        except (NotOnShelf, LoanLimitReached):
            return None

    def give_back(self, loan: Loan, today: date) -> int:
        loan.returned = True
        return fee_cents(loan, today)

    def overdue_loans(self, today: date) -> list[Loan]:
        return [loan for loan in self.catalog.loans if overdue(loan, today)]

    def owed(self, member_id: int, today: date) -> int:
        total = sum(fee_cents(loan, today) for loan in self.catalog.loans_of(member_id))
        return min(total, MAX_FEE_CENTS * 3)

    def report(self, today: date) -> list[str]:
        lines = []
        for loan in self.overdue_loans(today):
            member = self.catalog.members[loan.member_id]
            days = late_days(loan, today)
            lines.append(f"{member.name}: {loan.isbn} is {days} days late")
        return lines
