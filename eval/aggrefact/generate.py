#!/usr/bin/env python3
"""Writes eval/aggrefact/fixture.jsonl: rows in the shape of the LLM-AggreFact benchmark
(dataset, doc, claim, label) that the project wrote itself, for `release-harness eval
--format aggrefact` (its test, and scripts/real-model.sh).

Nothing here is taken from the benchmark (whose data may be used for evaluation only and
is fetched by the operator, see the README). Three made-up "datasets":

- release-notes: short product notes (a few hundred bytes), two claims each;
- meeting-minutes: minutes of medium length (1.5 to 3 kB), five claims each;
- postmortems: long incident reports (about 6 kB, two excerpts each) and one report
  with a sensor appendix of about 55 kB, more than the judge's input budget holds with the
  default limits (its rows are reported as over budget, never sent).

Label 1: every part of the claim follows from the document. Label 0: some part does not
(a changed number, name or time, a cause the document does not give, a contradiction, an
added detail). Run from the repository root: python3 eval/aggrefact/generate.py
(deterministic output).
"""

import json
import os

ROWS = []


def add(dataset, doc, claims):
    for claim, label in claims:
        ROWS.append({"dataset": dataset, "doc": doc, "claim": claim, "label": label})


# --------------------------------------------------------------------------- release-notes

NOTES = [
    (
        "Version 4.2 of the Fenwick label printer driver adds support for 62 mm continuous "
        "rolls and fixes a bug that made the printer skip every third label when the print "
        "speed was set to maximum. The driver now requires macOS 13 or later; users of older "
        "systems should stay on version 4.1, which remains available for download until the "
        "end of June.",
        [
            ("Driver 4.2 fixes a bug in which every third label was skipped at maximum print speed.", 1),
            ("Driver 4.2 adds support for 102 mm continuous rolls.", 0),
        ],
    ),
    (
        "The Harbor Street branch of the Millbrook public library will close for renovation "
        "from 3 February to 28 April. During the closure, holds can be collected at the "
        "Elm Park branch, and the book drop outside Harbor Street will stay open. The "
        "renovation adds a children's reading room and replaces the heating system.",
        [
            ("During the renovation, holds can be picked up at the Elm Park branch.", 1),
            ("The Harbor Street book drop will be closed during the renovation.", 0),
        ],
    ),
    (
        "Quarry Lane Coffee's winter blend is a mix of Ethiopian and Colombian beans roasted "
        "to a medium-dark level. It is sold in 250 g and 1 kg bags. Starting this season the "
        "bags are compostable, and the company donates 50 cents from each 1 kg bag to a "
        "growers' cooperative in Huila.",
        [
            ("The winter blend combines Ethiopian and Colombian beans.", 1),
            ("The company donates one dollar from each 250 g bag to a cooperative in Huila.", 0),
        ],
    ),
    (
        "Release 2.8 of the Tallow task scheduler changes the default retry limit from 3 to 5 "
        "attempts and adds exponential back-off between retries, starting at 2 seconds. Jobs "
        "that set their own retry limit are not affected. The deprecated cron_legacy option "
        "has been removed.",
        [
            ("In Tallow 2.8 the default retry limit rose from 3 to 5 attempts.", 1),
            ("Tallow 2.8 keeps the cron_legacy option but marks it as deprecated.", 0),
        ],
    ),
    (
        "The Northgate swimming pool reopened on 9 September after its roof was replaced. "
        "Opening hours are 6:30 to 21:00 on weekdays and 8:00 to 18:00 at weekends. Lane "
        "swimming must now be booked online, while family sessions on Saturday mornings "
        "remain open to walk-in visitors.",
        [
            ("At weekends the Northgate pool opens at 8:00 and closes at 18:00.", 1),
            ("Family sessions on Saturday mornings must now be booked online.", 0),
        ],
    ),
    (
        "Orchid Mobile's new Saver plan costs 12 euros per month and includes 20 GB of data, "
        "unlimited calls within the country and 100 minutes of calls to other EU countries. "
        "Unused data does not roll over to the next month. Customers can switch plans once "
        "per billing cycle without a fee.",
        [
            ("The Saver plan includes 100 minutes of calls to other EU countries.", 1),
            ("Unused data on the Saver plan rolls over to the following month.", 0),
        ],
    ),
    (
        "Kestrel Bikes is recalling 1,140 units of its Ridgeline 2 e-bike sold between May and "
        "August because the battery mount can loosen on rough terrain. Owners should stop "
        "riding the bike and contact a dealer, who will fit a redesigned mount free of charge. "
        "No injuries have been reported.",
        [
            ("The recall covers Ridgeline 2 e-bikes sold between May and August.", 1),
            ("Two riders were injured when the battery mount came loose.", 0),
        ],
    ),
]

for doc, claims in NOTES:
    add("release-notes", doc, claims)

# ------------------------------------------------------------------------- meeting-minutes

MINUTES_1 = """Minutes of the Westbrook Community Garden committee, 4 May

Present: Alma Reyes (chair), Tomasz Wojcik (treasurer), Fatima Hassan, Greg Oduya, Lena Brandt.
Apologies: Ruth Kim.

1. Finances. Tomasz reported a balance of 2,310 pounds after the spring plant sale, which raised 640 pounds. The water bill for the first quarter was 185 pounds, higher than last year because of the leaking tap by the shed, which has since been repaired. The committee agreed to keep a reserve of at least 1,000 pounds.

2. Plot allocations. Eleven people are on the waiting list. Two plots became free in April: plot 7 will go to the first person on the list, and plot 12 will be split into two half plots for the next two people. Fatima will write to all three this week.

3. Tool shed. Greg proposed replacing the shed's roof felt before winter. He obtained two quotes, 420 pounds and 365 pounds. The committee chose the lower quote, on the condition that the work is finished by the end of September.

4. Open day. The open day will be held on Saturday 21 June from 11:00 to 15:00. Lena will organise the seed swap, and Alma will ask the primary school whether its pupils can exhibit the scarecrows they made. The committee decided not to sell hot food this year because of the cost of the hygiene certificate.

5. Any other business. Ruth had asked by email whether dogs may be brought into the garden. After a discussion, the committee decided that dogs are allowed on leads on the main paths only.

The next meeting will be on 1 June at 19:00 in the church hall."""

MINUTES_2 = """Platform team weekly sync, Thursday

Attendees: Dana Whitfield (engineering manager), Omar Saleh, Keiko Tanaka, Bruno Lima, Sofia Marchetti

Dana opened by reminding everyone that the quarterly planning document is due on Friday of next week.

Omar: The migration of the build agents to the new instance type is 80 percent done. 34 of the 42 agents now run on the new machines, and average build time dropped from 14 minutes to 9 minutes. The remaining eight agents run the iOS builds and need a macOS image that the vendor will only deliver at the end of the month.

Keiko: The on-call rotation had a quiet week, with three pages, all from the disk space alert on the artifact store. She proposed raising the alert threshold from 80 to 85 percent and adding a cleanup job for artifacts older than 90 days. Bruno objected that some release artifacts must be kept for a year for compliance. The team agreed that the cleanup job will skip anything tagged as a release.

Bruno: The secrets rotation for the staging database failed on Tuesday because the rotation script still pointed at the old vault path. He fixed the path and ran the rotation by hand on Wednesday. He will add a test that runs the script against a sandbox vault every night.

Sofia: She presented the results of the developer survey. 58 of 73 engineers answered. The most common complaint was flaky integration tests, named by 31 people, followed by slow code review, named by 19. Dana asked Sofia to pick the five flakiest tests and open tickets for them.

Decisions: the disk alert threshold goes to 85 percent; the artifact cleanup job skips release-tagged artifacts; Bruno owns the nightly rotation test.

Action items: Omar follows up with the vendor on the macOS image; Sofia opens tickets for the five flakiest tests; Keiko writes the cleanup job."""

MINUTES_3 = """Riverside Tenants' Association, general meeting, 12 November

The meeting was opened at 18:30 by the secretary, Henry Osei, because the chair, Marta Kowalczyk, was delayed. Marta arrived at 18:50 and took over. 46 households were represented, which meets the quorum of 40.

Heating. Several tenants in block C reported that their radiators were cold for four days in late October. The building manager, Mr. Paulsen, attended and explained that a circulation pump had failed and that the replacement part had to be ordered from Germany. He said that a spare pump is now kept on site. Tenants asked for compensation; Mr. Paulsen said he would pass the request to the owners but could not promise anything.

Rent increase. The owners have announced an increase of 3.5 percent from 1 January. Henry reminded the meeting that the increase last year was 2 percent. After a long discussion, the meeting voted 31 to 12, with 3 abstentions, to ask the owners for a meeting before the increase takes effect and to request the maintenance accounts for the last two years.

Bicycle storage. The new bicycle room in the basement of block A is finished and has space for 60 bicycles. Keys can be collected from Henry against a deposit of 20 euros. Tenants of blocks B and C may also use it.

Elections. Marta announced that she will not stand again as chair next year. Nominations for the committee are open until 31 January.

The meeting closed at 20:40."""

add("meeting-minutes", MINUTES_1, [
    ("The spring plant sale raised 640 pounds.", 1),
    ("The committee chose Greg's quote of 420 pounds for the new roof felt.", 0),
    ("Plot 12 will be split into two half plots.", 1),
    ("Hot food will be sold at the open day on 21 June.", 0),
    ("Dogs on leads are allowed on the main paths of the garden.", 1),
])
add("meeting-minutes", MINUTES_2, [
    ("Average build time fell from 14 to 9 minutes after 34 of 42 agents moved to the new instance type.", 1),
    ("All three pages of the week came from the CPU alert on the build agents.", 0),
    ("The artifact cleanup job will skip artifacts tagged as releases.", 1),
    ("The secrets rotation failed because the staging database was down on Tuesday.", 0),
    ("Flaky integration tests were the most common complaint in the developer survey.", 1),
])
add("meeting-minutes", MINUTES_3, [
    ("The radiators in block C were cold because a circulation pump failed.", 1),
    ("The owners agreed to compensate the tenants of block C.", 0),
    ("The meeting voted 31 to 12 to ask the owners for a meeting before the rent increase.", 1),
    ("The owners announced a rent increase of 2 percent from 1 January.", 0),
    ("The bicycle room in block A can hold 80 bicycles.", 0),
])

# ----------------------------------------------------------------------------- postmortems


def timeline(entries):
    return "\n".join(f"{t} {text}" for t, text in entries)


PM_CHECKOUT = """Postmortem: checkout outage on 14 March

Summary

On 14 March between 09:12 and 10:47 UTC, customers of Larkspur Outfitters could not complete purchases on the web shop or in the mobile app. At the peak, the checkout service answered 61 percent of requests with HTTP 503. The incident was declared at severity 2 at 09:20 by the on-call engineer, Priya Natarajan, and downgraded to severity 3 at 10:35 once the error rate began to fall.

Impact

About 9,400 checkout attempts failed during the incident. Browsing, search and the basket were not affected. Customer support received 412 tickets about failed payments. No card was charged twice: the payment provider only captures an authorisation after the order is written, and no order was written for the failed attempts. No orders were lost either: 3,870 baskets whose checkout failed were recovered by the retry queue within the two hours after the incident, and their owners received the usual confirmation email.

Root cause

A configuration change merged on 13 March lowered the connection pool of the payments database client from 200 to 20 connections. The change was meant for the staging environment, where the database is small and a large pool had caused connection errors. The deployment pipeline applied the staging overlay to production because of a typo in the manifest, which referred to overlays/stagin instead of overlays/staging; the tool fell back to the shared base directory, which the change had also edited. Under the Monday morning load, checkout workers waited for a database connection, and requests that waited more than 5 seconds timed out and were answered with HTTP 503.

Detection

The first alert fired at 09:14 from the synthetic checkout probe, which places a test order every minute. The error-rate alert on the checkout service followed at 09:16. The database itself showed no sign of trouble: CPU stayed below 30 percent and the number of open connections fell, which at first led the team to look for a network problem.

Timeline (UTC)

""" + timeline([
    ("09:05", "Weekly traffic ramp begins as European customers come online."),
    ("09:12", "Checkout error rate rises above 5 percent."),
    ("09:14", "Synthetic checkout probe alert fires and pages the on-call engineer."),
    ("09:16", "Checkout error-rate alert fires."),
    ("09:20", "Priya Natarajan declares a severity 2 incident and opens the incident channel."),
    ("09:31", "Network team confirms that packet loss between the checkout service and the database is zero."),
    ("09:44", "Database team reports that open connections dropped from about 180 to 20 at 07:50, when the nightly deployment finished."),
    ("09:58", "Marcus Feld finds the pool size change in the deployment diff."),
    ("10:06", "The team decides to revert rather than patch the production overlay by hand."),
    ("10:21", "The revert is deployed to production."),
    ("10:29", "Error rate falls below 10 percent."),
    ("10:35", "Incident downgraded to severity 3."),
    ("10:47", "Error rate back at baseline, below 0.5 percent. Incident resolved."),
    ("12:40", "Retry queue has recovered all 3,870 failed baskets."),
]) + """

What went well

The synthetic probe detected the problem two minutes after it started, before any customer report arrived. The revert was deployed eleven minutes after the decision was taken, and the retry queue worked as designed.

What went badly

The team spent about 25 minutes on the network theory because the database dashboards showed healthy CPU and fewer connections, which looked like a sign of a connectivity problem rather than of a smaller pool. The connection pool size is not shown on any dashboard, and the deployment tool does not fail when an overlay directory is missing.

Follow-up actions

1. Make the deployment tool reject a manifest that names an overlay directory that does not exist (owner: Marcus Feld, due 31 March).
2. Add the client connection pool size and its saturation to the checkout dashboard, and alert when saturation stays above 80 percent for five minutes (owner: Priya Natarajan, due 7 April).
3. Run a game day on the payments database path in April, including a pool exhaustion scenario (owner: platform team).
4. Review every other manifest for references to missing overlays (done on 15 March; none found).

Customer communication

The status page was updated at 09:26 with a notice that some customers could not complete purchases, and again at 10:25 when the fix was being deployed. The social media team answered questions with a link to the status page. After the incident, the support team sent an apology email to the 412 customers who had opened tickets, with a voucher for free shipping on their next order. The voucher was not sent to customers whose baskets were recovered automatically, because their orders completed without any action on their part.

Detailed analysis of the waiting workers

Each checkout worker holds a database connection for the duration of an order write, which normally takes about 40 milliseconds. With 200 connections shared by 24 workers per pod and 6 pods, the pool was never close to exhausted before the change. With 20 connections, the 144 workers competed for a tenth of the connections; at the Monday peak of about 350 checkouts per second, the median wait for a connection grew to 3.2 seconds and the slowest tenth of requests waited longer than the 5-second limit. The number of open connections reported by the database fell because the clients now opened fewer of them, which is why the database looked healthier than usual while the service failed.

Cost

Finance estimates that about 60 percent of the failed checkouts were completed later by the same customers, either through the retry queue or by trying again. The estimated revenue lost is between 38,000 and 52,000 euros, most of it from customers who abandoned their purchase. The shipping vouchers are expected to cost about 2,500 euros."""

PM_DNS = """Postmortem: DNS resolution failures in the Frankfurt region, 2 October

Summary

From 16:03 to 17:19 CEST on 2 October, about one in four DNS lookups made by services in the Frankfurt region failed with SERVFAIL. Services that cached their lookups kept working; services that resolved a name for every request, most visibly the image resizing service and the notification gateway, failed intermittently. The incident was handled at severity 2 by the infrastructure on-call, Jonas Becker.

Background

Each region runs three recursive resolvers behind an anycast address. The resolvers forward queries for internal zones to the authoritative servers and resolve public names themselves. A configuration management run applies resolver settings every 30 minutes.

Root cause

A change to the resolvers' configuration, meant to raise the cache size from 512 MB to 1 GB, was applied by the configuration management run at 16:00. The template that renders the configuration also contained an unrelated, earlier edit that had never been deployed because the run had been paused for a maintenance window: it lowered the maximum number of concurrent outgoing queries from 2,000 to 200. When the run was resumed, both edits went out together. Under the afternoon load, the resolvers reached the limit of 200 concurrent outgoing queries and answered SERVFAIL to queries they could not forward. Only one of the three resolvers, resolver-fra-2, had a cold cache after the restart that the change triggered; it produced most of the failures because it had to forward nearly every query.

Detection

The SERVFAIL rate alert fired at 16:07. The notification gateway's own error alert fired at 16:09. Users noticed broken thumbnails on product pages from about 16:10.

Timeline (CEST)

""" + timeline([
    ("16:00", "Configuration management run applies the resolver change; resolvers restart one after another."),
    ("16:03", "SERVFAIL responses begin, almost all from resolver-fra-2."),
    ("16:07", "SERVFAIL rate alert fires; Jonas Becker acknowledges."),
    ("16:09", "Notification gateway error alert fires."),
    ("16:18", "Jonas removes resolver-fra-2 from the anycast group; the failure rate drops from 25 to 9 percent."),
    ("16:34", "Resolver logs show 'outgoing query limit reached'; the team finds the limit of 200 in the rendered configuration."),
    ("16:41", "Decision to restore the limit of 2,000 on all three resolvers by hand, then fix the template."),
    ("16:52", "Limit restored on resolver-fra-1 and resolver-fra-3."),
    ("17:05", "Limit restored on resolver-fra-2; it is returned to the anycast group with a warmed cache."),
    ("17:19", "SERVFAIL rate back below 0.1 percent. Incident resolved."),
]) + """

Impact

About 1.2 million lookups failed. The image resizing service returned errors for roughly 8 percent of thumbnail requests during the incident. The notification gateway delayed about 14,000 push notifications by up to 40 minutes; none were lost, because the gateway retries with back-off. Customer-facing checkout and login were not affected, because those services cache their lookups for 60 seconds.

Lessons

Pausing the configuration management run let an unreviewed edit wait in the template and ship later with an unrelated change. The resolver dashboards showed cache hit rate and latency but not the number of concurrent outgoing queries, so the limit was only found in the logs.

Follow-up actions

1. Show pending template changes in the configuration management run's summary before a paused run resumes (owner: Jonas Becker).
2. Add the concurrent outgoing query count and its limit to the resolver dashboard and alert at 75 percent of the limit (owner: infrastructure team).
3. Make the image resizing service and the notification gateway cache DNS lookups for at least 30 seconds (owners: media team, messaging team).
4. Restart resolvers one at a time with a cache warm-up step (owner: infrastructure team).

Why the lower limit had been written

The limit of 200 concurrent outgoing queries had been proposed in August by a security review, which was worried that a compromised service could use the resolvers to flood an external name server. The reviewer suggested the value without load data, and the edit was made in the template with the intention of testing it in staging first. The maintenance window paused configuration management the same week, and the edit was forgotten. The security concern is still valid: the follow-up is to enforce a per-client query rate instead of a global limit on outgoing queries, which punishes every service for the behaviour of one.

Communication

An internal status message went out at 16:15 and was updated every 20 minutes. Because customer-facing login and checkout were not affected, the public status page only showed a notice about delayed notifications and missing product images, posted at 16:25 and closed at 17:30. The media team asked for earlier warning of resolver changes, and resolver changes will now be announced in the infrastructure channel a day in advance.

Measurements after the fix

With the limit restored to 2,000, the resolvers peaked at 640 concurrent outgoing queries the next afternoon, so the lower limit would have been exceeded every working day. Cache hit rate with the new 1 GB cache rose from 71 to 83 percent, which the team expects to reduce outgoing queries by about a third once the change has been in place for a week."""


def sensor_appendix():
    """A long appendix of readings: more text than the judge's input budget holds."""
    lines = []
    for i in range(560):
        minute = i % 60
        hour = 2 + i // 60
        line = 1 + i % 4
        pressure = 3.80 + ((i * 37) % 90) / 100
        temperature = 31.0 + ((i * 53) % 70) / 10
        lines.append(
            f"{hour:02d}:{minute:02d} loop {line}: supply pressure {pressure:.2f} bar, "
            f"return temperature {temperature:.1f} C, valve V{line}{(i * 7) % 10} at {(i * 13) % 100} percent open."
        )
    return "\n".join(lines)


PM_COOLING = """Incident report: cooling loop pressure excursion at plant 2, night of 21 to 22 July

Summary

During the night shift of 21 to 22 July, the supply pressure of cooling loop 3 at plant 2 rose above its alarm limit of 4.60 bar four times between 03:10 and 05:40. The loop was never above its safety limit of 5.20 bar, and no equipment was damaged. The cause was a sticking control valve, V35, which was replaced on 23 July. Production was slowed by 15 percent for two hours as a precaution.

Appendix: readings of loops 1 to 4 recorded every minute from 02:00

""" + sensor_appendix()

add("postmortems", PM_CHECKOUT, [
    ("The checkout outage lasted from 09:12 to 10:47 UTC and was caused by a connection pool reduced from 200 to 20 connections.", 1),
    ("The connection pool of the payments database client was lowered from 200 to 50 connections.", 0),
    ("A typo in the manifest's overlay path caused the staging overlay to be applied to production.", 1),
    ("The outage was caused by a failed database failover during the Monday morning load.", 0),
    ("Several hundred orders were permanently lost during the incident.", 0),
    ("Customer support received 412 tickets about failed payments.", 1),
])
add("postmortems", PM_DNS, [
    ("Most of the DNS failures came from resolver-fra-2, whose cache was cold after the restart.", 1),
    ("The resolvers failed because the change raised the cache size to 4 GB and they ran out of memory.", 0),
    ("About 14,000 push notifications were delayed, and none were lost.", 1),
    ("Checkout and login failed for about 25 percent of customers during the incident.", 0),
    ("Jonas Becker removed resolver-fra-2 from the anycast group at 16:18.", 1),
])
add("postmortems", PM_COOLING, [
    ("The supply pressure of loop 3 never exceeded the safety limit of 5.20 bar.", 1),
    ("The excursion damaged the loop 3 pump, which was replaced on 23 July.", 0),
])


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixture.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for i, row in enumerate(ROWS):
            row = {"id": f"{row['dataset']}-{i + 1:02d}", **row}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    datasets = sorted({r["dataset"] for r in ROWS})
    print(f"{out}: {len(ROWS)} rows, datasets {', '.join(datasets)}, "
          f"{sum(r['label'] for r in ROWS)} labelled 1")


if __name__ == "__main__":
    main()
