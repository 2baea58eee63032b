"""Who is calling: Klique's own tokens (users, service users, admins), the company's single
sign-on (OpenID Connect: bearer access tokens and browser sessions) and LDAP passwords, each
turned into one identity (a user and a team) that every path shares."""
