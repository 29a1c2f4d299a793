/* A running task's page keeps its progress, log and steps current: every few seconds
 * (the blocks' data-refresh attribute) it reads the page again and puts each block marked
 * data-pgtasks-live in place of the one shown, until the task no longer runs. It waits
 * while the tab is hidden. Without JavaScript, reloading the page does the same.
 */
'use strict';
{
    const running = () => document.querySelector('[data-pgtasks-live="running"]');
    const first = running();
    if (first) {
        const interval = Number(first.dataset.refresh) * 1000;
        const refresh = async () => {
            if (!document.hidden) {
                try {
                    const response = await fetch(window.location.href,
                                                 {credentials: 'same-origin'});
                    if (response.ok) {
                        const page = new DOMParser().parseFromString(
                            await response.text(), 'text/html');
                        for (const block of document.querySelectorAll('[data-pgtasks-live]')) {
                            const fresh = page.getElementById(block.id);
                            if (fresh) {
                                block.replaceWith(fresh);
                            }
                        }
                    }
                } catch (error) {
                    // The next read tries again.
                }
            }
            if (running()) {
                setTimeout(refresh, interval);
            }
        };
        setTimeout(refresh, interval);
    }
}
